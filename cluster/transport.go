package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// abortableTransport is memberlist's UDP+TCP transport: memberlist's
// NetTransport, but for three things.
//
// Its streams end when the cluster closes. memberlist dials with a plain
// timeout (its TCPTimeout, 10 s) and gives a stream that long to
// complete, so a push, an anti-entropy answer or a rejoin attempt to a
// member that stopped answering held Close, and with it the plugin's
// SIGTERM, for ten seconds. Here every dial takes the cluster's context
// and every open stream is closed when it is cancelled.
//
// Its streams leave from the address the node advertises: the others
// tell members from strangers by a stream's source (screen.go), and the
// kernel would otherwise pick the route's, which on a multi-homed host,
// or on loopback, is another. Where that address is not local (behind
// NAT) the kernel's pick stands.
//
// It reads datagrams into one buffer and hands each on in a slice of its
// own size. NetTransport allocates 64 KiB per datagram, for the few
// hundred bytes a gossip packet carries: at 100 hosts that garbage was
// most of the allocations, and the GC a fifth of the CPU.
type abortableTransport struct {
	ctx    context.Context
	source atomic.Pointer[net.TCPAddr] // nil: the kernel picks
	// pool carries the streams to members that take sessions
	// (streampool.go); nil: every stream is a connection of its own.
	pool *streamPool

	tcp     *net.TCPListener
	udp     *net.UDPConn
	packets chan *memberlist.Packet
	streams chan net.Conn
	logger  *log.Logger
	done    chan struct{} // closed by Shutdown
	stop    sync.Once
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*abortableTransport)(nil)

const (
	// maxDatagram is the largest datagram read whole.
	maxDatagram = 65536
	// udpRecvBuffer is the socket's receive buffer asked for, as
	// NetTransport does (halved until the kernel takes it).
	udpRecvBuffer = 2 << 20
)

// newAbortableTransport binds the gossip port, TCP and UDP, on
// mc.BindAddr (retrying a port-0 bind, which races between UDP and TCP)
// and reports the port it got in mc.
func newAbortableTransport(ctx context.Context, mc *memberlist.Config) (*abortableTransport, error) {
	logger := mc.Logger
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	ip := net.ParseIP(mc.BindAddr)
	tries := 1
	if mc.BindPort == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var tcp *net.TCPListener
		var udp *net.UDPConn
		if tcp, err = net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: mc.BindPort}); err != nil {
			continue
		}
		port := tcp.Addr().(*net.TCPAddr).Port
		if udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port}); err != nil {
			tcp.Close()
			continue
		}
		for size := udpRecvBuffer; size > 0; size /= 2 {
			if udp.SetReadBuffer(size) == nil {
				break
			}
		}
		if mc.BindPort == 0 {
			mc.BindPort, mc.AdvertisePort = port, port
		}
		t := &abortableTransport{ctx: ctx, tcp: tcp, udp: udp, logger: logger,
			packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
		if ip := net.ParseIP(mc.AdvertiseAddr); ip != nil && !ip.IsUnspecified() {
			t.source.Store(&net.TCPAddr{IP: ip})
		}
		t.wg.Add(2)
		go t.acceptStreams()
		go t.readDatagrams()
		return t, nil
	}
	return nil, fmt.Errorf("bind gossip port: %w", err)
}

// FinalAdvertiseAddr: the cluster always gives its address (New).
func (t *abortableTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	a := net.ParseIP(ip)
	if a == nil {
		return nil, 0, fmt.Errorf("advertise address %q is not an IP address", ip)
	}
	if a4 := a.To4(); a4 != nil {
		a = a4
	}
	return a, port, nil
}

func (t *abortableTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *abortableTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	to, err := netip.ParseAddrPort(a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteToUDPAddrPort(b, to)
	return time.Now(), err
}

func (t *abortableTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *abortableTransport) StreamCh() <-chan net.Conn           { return t.streams }

// Shutdown closes the sockets and waits for the readers, which hand
// nothing on once it started.
func (t *abortableTransport) Shutdown() error {
	t.stop.Do(func() {
		close(t.done)
		t.tcp.Close()
		t.udp.Close()
	})
	t.wg.Wait()
	return nil
}

func (t *abortableTransport) closing() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// acceptStreams hands accepted connections on. Accept errors (out of
// descriptors) back off from 5 ms to 1 s, as NetTransport does.
func (t *abortableTransport) acceptStreams() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		conn, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closing() {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.logger.Printf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			select {
			case <-time.After(delay):
			case <-t.done:
				return
			}
			continue
		}
		delay = 0
		select {
		case t.streams <- conn:
		case <-t.done:
			conn.Close()
			return
		}
	}
}

// readDatagrams hands each datagram on in a slice of its own: memberlist
// may keep it (a queued user message).
func (t *abortableTransport) readDatagrams() {
	defer t.wg.Done()
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		ts := time.Now()
		if err != nil {
			if t.closing() {
				return
			}
			t.logger.Printf("[ERR] memberlist: Error reading UDP packet: %v", err)
			continue
		}
		if n < 1 {
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) // as NetTransport's net.UDPAddr prints
		p := &memberlist.Packet{Buf: bytes.Clone(buf[:n]), From: net.UDPAddrFromAddrPort(from), Timestamp: ts}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}

// DialTimeout and DialAddressTimeout replace NetTransport's: memberlist
// calls the second, the first is the plain Transport's.
func (t *abortableTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *abortableTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.pool != nil {
		return t.pool.open(a.Name, a.Addr, timeout)
	}
	return t.dialPlain(a.Addr, timeout)
}

// dialPlain dials a connection of its own to addr.
func (t *abortableTransport) dialPlain(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if src := t.source.Load(); src != nil {
		d.LocalAddr = src
	}
	conn, err := d.DialContext(t.ctx, "tcp", addr)
	if errors.Is(err, syscall.EADDRNOTAVAIL) && d.LocalAddr != nil {
		t.source.Store(nil) // not an address of this host's
		d.LocalAddr = nil
		conn, err = d.DialContext(t.ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	return newAbortableConn(t.ctx, conn), nil
}

// abortableConn is a stream closed when ctx is cancelled, or by its user.
type abortableConn struct {
	net.Conn
	once sync.Once
	stop func() bool
}

func newAbortableConn(ctx context.Context, conn net.Conn) *abortableConn {
	c := &abortableConn{Conn: conn}
	c.stop = context.AfterFunc(ctx, func() { c.Conn.Close() })
	return c
}

func (c *abortableConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.stop()
		err = c.Conn.Close()
	})
	return err
}
