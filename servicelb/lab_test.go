package servicelb

// The privileged tests' network: a client and three backends, each in a
// namespace of its own, on a bridge in a fifth, "switch" namespace, as
// containers on one overlay network. The client's namespace is published
// on a path, as Docker publishes a container's as its SandboxKey. Backends
// run a TCP and a UDP server answering their own name.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/testns"
)

const (
	tcpPort = 8080
	udpPort = 8081
	// ioTimeout bounds every exchange: long enough for a machine under
	// load, short enough that a broken path fails the test quickly.
	ioTimeout = 5 * time.Second
)

// Addresses: the client is .10, backend i is .i+1; VIPs are addresses of
// the same subnet that no namespace owns.
var (
	subnet4 = netip.MustParsePrefix("203.0.113.0/24")
	subnet6 = netip.MustParsePrefix("fd00:5b::/64")
	vip4    = netip.MustParseAddr("203.0.113.100")
	vip6    = netip.MustParseAddr("fd00:5b::100")
	vipNone = netip.MustParseAddr("203.0.113.101") // a service without backends
)

func nth(p netip.Prefix, i int) netip.Addr {
	a := p.Addr()
	for range i {
		a = a.Next()
	}
	return a
}

type node struct {
	name         string
	ns           netns.NsHandle
	addr4, addr6 netip.Addr
}

type lab struct {
	client     node
	clientPath string // the client's namespace, as a path
	backends   []node // "A", "B", "C"
	// lastPort is the client's last source port. Every connection gets a
	// port of its own: one that reused a port could find the conntrack
	// entry of an earlier connection (UDP ones last 30 s and more) and
	// follow it to the same backend, uncounted.
	lastPort atomic.Int32
}

// dialer binds the client's next connection over network ("tcp" or
// "udp") to a port never used before in the lab.
func (l *lab) dialer(network string) *net.Dialer {
	port := int(l.lastPort.Add(1))
	if port > 65535 {
		panic("lab: out of source ports")
	}
	d := &net.Dialer{Timeout: ioTimeout, LocalAddr: &net.TCPAddr{Port: port}}
	if network == "udp" {
		d.LocalAddr = &net.UDPAddr{Port: port}
	}
	return d
}

func newLab(t *testing.T) *lab {
	t.Helper()
	testns.RequireRoot(t)
	rootClean(t)

	sw := testns.New(t)
	hsw, err := netlink.NewHandleAt(sw)
	if err != nil {
		t.Fatal(err)
	}
	defer hsw.Close()
	off := false
	if err := hsw.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "slbbr0"}, MulticastSnooping: &off}); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	br := testns.SetUp(t, hsw, "slbbr0")

	l := &lab{client: node{name: "client", addr4: nth(subnet4, 10), addr6: nth(subnet6, 10)}}
	l.lastPort.Store(20000)
	for i, name := range []string{"A", "B", "C"} {
		l.backends = append(l.backends, node{name: name, addr4: nth(subnet4, i+1), addr6: nth(subnet6, i+1)})
	}
	nodes := append([]*node{&l.client}, ptrs(l.backends)...)
	for i, n := range nodes {
		n.ns = testns.New(t)
		port := fmt.Sprintf("slbp%d", i)
		if err := hsw.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index},
			PeerName: "slbeth0", PeerNamespace: netlink.NsFd(n.ns)}); err != nil {
			t.Fatalf("add veth for %s: %v", n.name, err)
		}
		testns.SetUp(t, hsw, port)
		h, err := netlink.NewHandleAt(n.ns)
		if err != nil {
			t.Fatal(err)
		}
		testns.SetUp(t, h, "lo")
		eth := testns.SetUp(t, h, "slbeth0")
		testns.AddAddr(t, h, eth, netip.PrefixFrom(n.addr4, subnet4.Bits()).String())
		testns.AddAddr(t, h, eth, netip.PrefixFrom(n.addr6, subnet6.Bits()).String())
		h.Close()
	}
	l.clientPath = testns.Publish(t, l.client.ns, "slb")
	for _, b := range l.backends {
		serveTCP(t, b)
		serveUDP(t, b.ns, fmt.Sprintf(":%d", udpPort), b.name)
	}
	l.warmUp(t)
	return l
}

func ptrs(ns []node) []*node {
	out := make([]*node, len(ns))
	for i := range ns {
		out[i] = &ns[i]
	}
	return out
}

// serveTCP answers every line on every connection with the backend's name.
func serveTCP(t *testing.T, b node) {
	t.Helper()
	var ln net.Listener
	if err := testns.Do(b.ns, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", tcpPort))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", b.name, err)
	}
	var (
		mu    sync.Mutex // guards conns; leaf lock
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					if _, err := c.Write([]byte(b.name + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// serveUDP answers every datagram to laddr in ns with answer.
func serveUDP(t *testing.T, ns netns.NsHandle, laddr, answer string) {
	t.Helper()
	var pc net.PacketConn
	if err := testns.Do(ns, func() (err error) {
		pc, err = net.ListenPacket("udp", laddr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s for %s: %v", laddr, answer, err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(answer), from)
		}
	}()
}

// warmUp reaches every backend directly (not through a VIP) on both
// families until it answers: packets sent before a veth's carrier is up
// or a neighbour resolved could be lost and muddle the expectations.
func (l *lab) warmUp(t *testing.T) {
	t.Helper()
	for _, b := range l.backends {
		for _, dst := range []netip.Addr{b.addr4, b.addr6} {
			deadline := time.Now().Add(10 * time.Second)
			for {
				got, err := l.ask(dst)
				if err == nil && got == b.name {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("backend %s unreachable at %s: %q, %v", b.name, dst, got, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}

// stream is a TCP connection from the client, and the backend that
// answered on it first.
type stream struct {
	conn    net.Conn
	r       *bufio.Reader
	backend string
}

// dial opens a TCP connection from the client to dst.
func (l *lab) dial(dst netip.Addr) (*stream, error) {
	var c net.Conn
	err := testns.Do(l.client.ns, func() (err error) {
		c, err = l.dialer("tcp").Dial("tcp", netip.AddrPortFrom(dst, tcpPort).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	s := &stream{conn: c, r: bufio.NewReader(c)}
	if s.backend, err = s.ask(); err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// ask sends a line and returns the name that answers.
func (s *stream) ask() (string, error) {
	_ = s.conn.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := s.conn.Write([]byte("who?\n")); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// ask opens a TCP connection to dst, asks once and closes.
func (l *lab) ask(dst netip.Addr) (string, error) {
	s, err := l.dial(dst)
	if err != nil {
		return "", err
	}
	defer s.conn.Close()
	return s.backend, nil
}

// askUDP sends a datagram to dst from a fresh socket (a new connection
// for conntrack) and returns who answers, resending on the same socket if
// the answer is late.
func (l *lab) askUDP(dst netip.Addr) (string, error) {
	return l.askUDPAt(netip.AddrPortFrom(dst, udpPort))
}

func (l *lab) askUDPAt(dst netip.AddrPort) (string, error) {
	c, err := l.dialUDP(dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return askUDPOn(c)
}

// dialUDP opens a UDP socket in the client, connected to dst.
func (l *lab) dialUDP(dst netip.AddrPort) (c net.Conn, err error) {
	err = testns.Do(l.client.ns, func() (err error) {
		c, err = l.dialer("udp").Dial("udp", dst.String())
		return err
	})
	return c, err
}

// askUDPOn sends a datagram on c and returns who answers, resending if the
// answer is late.
func askUDPOn(c net.Conn) (string, error) {
	buf := make([]byte, 64)
	var err error
	for range 3 {
		if _, err = c.Write([]byte("who?")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(ioTimeout / 3))
		var n int
		if n, err = c.Read(buf); err == nil {
			return string(buf[:n]), nil
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return "", err
		}
	}
	return "", err
}

// spread asks dst n times, each on a new connection, and counts the
// answers per backend.
func (l *lab) spread(t *testing.T, dst netip.Addr, n int, udp bool) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		ask := l.ask
		if udp {
			ask = l.askUDP
		}
		name, err := ask(dst)
		if err != nil {
			t.Fatalf("connection %d to %s (udp %v): %v", i, dst, udp, err)
		}
		got[name]++
	}
	return got
}

func (l *lab) backendAddrs(v6 bool, names ...string) []netip.Addr {
	var out []netip.Addr
	for _, b := range l.backends {
		if len(names) > 0 && !slices.Contains(names, b.name) {
			continue
		}
		if v6 {
			out = append(out, b.addr6)
		} else {
			out = append(out, b.addr4)
		}
	}
	return out
}
