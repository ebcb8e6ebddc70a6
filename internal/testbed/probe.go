package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Probes run in this process, on a thread switched into the namespace (see
// Netns.Do): no ping binary, netcat or helper process is needed, and a
// probe cannot outlive its deadline.

// PingTimeout is how long one echo request waits for its reply.
const PingTimeout = time.Second

var pingSeq atomic.Uint32

// Ping sends one ICMP (or ICMPv6) echo request from the namespace to dst
// and waits up to timeout for the matching reply (same source, identifier,
// sequence and payload).
func (n *Netns) Ping(dst netip.Addr, timeout time.Duration) error {
	dst = dst.Unmap()
	network, laddr, reqType, replyType := "ip4:icmp", "0.0.0.0", byte(8), byte(0)
	if dst.Is6() {
		network, laddr, reqType, replyType = "ip6:ipv6-icmp", "::", 128, 129
	}
	var conn net.PacketConn
	err := n.Do(func() error {
		var err error
		conn, err = net.ListenPacket(network, laddr)
		return err
	})
	if err != nil {
		return fmt.Errorf("ping %s from %s: %w", dst, n.Name, err)
	}
	defer conn.Close()

	seq := pingSeq.Add(1)
	id, sq := uint16(os.Getpid()^int(seq>>16)), uint16(seq)
	payload := make([]byte, 56)
	_, _ = rand.Read(payload)
	msg := make([]byte, 8, 8+len(payload))
	msg[0] = reqType
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], sq)
	msg = append(msg, payload...)
	if dst.Is4() {
		// The kernel fills in ICMPv6 checksums itself, not ICMPv4 ones.
		binary.BigEndian.PutUint16(msg[2:], InetChecksum(msg))
	}
	deadline := time.Now().Add(timeout)
	_ = conn.SetDeadline(deadline)
	if _, err := conn.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return fmt.Errorf("ping %s from %s: send: %w", dst, n.Name, err)
	}
	buf := make([]byte, 1500)
	for {
		k, from, err := conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("ping %s from %s: no reply within %v", dst, n.Name, timeout)
			}
			return fmt.Errorf("ping %s from %s: receive: %w", dst, n.Name, err)
		}
		ipa, ok := from.(*net.IPAddr)
		if !ok {
			continue
		}
		src, ok := netip.AddrFromSlice(ipa.IP)
		if !ok || src.Unmap() != dst {
			continue
		}
		r := buf[:k]
		if len(r) < 8 || r[0] != replyType || r[1] != 0 ||
			binary.BigEndian.Uint16(r[4:]) != id || binary.BigEndian.Uint16(r[6:]) != sq ||
			!bytes.Equal(r[8:], payload) {
			continue
		}
		return nil
	}
}

// PingUntil pings dst once per PingTimeout until a reply arrives or overall
// passes; it returns the last failure. For the first packets of a path,
// while neighbour tables settle.
func (n *Netns) PingUntil(dst netip.Addr, overall time.Duration) error {
	deadline := time.Now().Add(overall)
	for {
		start := time.Now()
		err := n.Ping(dst, PingTimeout)
		if err == nil {
			return nil
		}
		if time.Now().Add(PingTimeout).After(deadline) {
			return fmt.Errorf("%w (gave up after %v)", err, overall)
		}
		// A send error returns at once: do not spin.
		time.Sleep(max(0, 200*time.Millisecond-time.Since(start)))
	}
}

// PingFails checks that none of count pings (PingTimeout each) to dst gets
// an answer: for asserting that a path is cut.
func (n *Netns) PingFails(dst netip.Addr, count int) error {
	for i := range count {
		if err := n.Ping(dst, PingTimeout); err == nil {
			return fmt.Errorf("ping %s from %s: answered (attempt %d of %d), want no answer", dst, n.Name, i+1, count)
		}
	}
	return nil
}

// InetChecksum is the Internet checksum (RFC 1071) of ICMP and IPv4 headers.
func InetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// Listen opens a TCP listener in the namespace.
func (n *Netns) Listen(addr netip.AddrPort) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, n.Name, err)
	}
	return l, nil
}

// Dial opens a TCP connection from the namespace.
func (n *Netns) Dial(addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, n.Name, err)
	}
	return c, nil
}

// EchoServer is a TCP server in a namespace that sends back what it reads.
type EchoServer struct {
	Addr netip.AddrPort
	l    net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

// EchoIdle bounds how long an echo connection may sit idle.
const EchoIdle = 30 * time.Second

// StartEcho starts an echo server on addr in the namespace; port 0 picks
// a free port (see EchoServer.Addr). Close stops it; the Bed also does.
func (n *Netns) StartEcho(addr netip.AddrPort) (*EchoServer, error) {
	return n.StartGreetingEcho(addr, "")
}

// StartGreetingEcho is StartEcho whose server first sends greeting and a
// newline on each connection (unless greeting is empty): which of several
// servers behind one address answered.
func (n *Netns) StartGreetingEcho(addr netip.AddrPort, greeting string) (*EchoServer, error) {
	l, err := n.Listen(addr)
	if err != nil {
		return nil, err
	}
	s := &EchoServer{Addr: l.Addr().(*net.TCPAddr).AddrPort(), l: l}
	s.Addr = netip.AddrPortFrom(s.Addr.Addr().Unmap(), s.Addr.Port())
	if n.bed != nil {
		n.bed.onCleanup("stop echo server "+s.Addr.String(), func() error { s.Close(); return nil })
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(EchoIdle))
				if greeting != "" {
					if _, err := io.WriteString(c, greeting+"\n"); err != nil {
						return
					}
				}
				if _, err := io.Copy(c, c); err != nil {
					s.mu.Lock()
					s.errs = append(s.errs, err)
					s.mu.Unlock()
				}
			}()
		}
	}()
	return s, nil
}

// Close stops the server and waits for its connections (each bounded by
// EchoIdle). It returns the errors the connections met.
func (s *EchoServer) Close() error {
	_ = s.l.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// TCPExchange connects from the namespace to an echo server at addr, sends
// size random bytes, half-closes, and checks that exactly the same bytes come
// back, all within timeout. A size well above the MTU exercises
// segmentation and the path MTU.
func (n *Netns) TCPExchange(addr netip.AddrPort, size int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c, err := n.Dial(addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	data := make([]byte, size)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, rerr := io.ReadAll(c)
	if err := <-werr; err != nil {
		return fmt.Errorf("tcp %s -> %s: send: %w", n.Name, addr, err)
	}
	if rerr != nil {
		return fmt.Errorf("tcp %s -> %s: received %d of %d bytes: %w", n.Name, addr, len(got), size, rerr)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("tcp %s -> %s: echo differs (%d bytes sent, %d received)", n.Name, addr, size, len(got))
	}
	return nil
}
