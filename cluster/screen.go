package cluster

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// screenTransport stands between memberlist and its transport and refuses
// what memberlist should never handle (mlwire.go): compressed input, which
// it would inflate some thousand times; undecryptable or plaintext input
// in an encrypted cluster; unknown message types; broken compounds and
// checksums. Each refusal is reported once (Cluster.reject: counted by
// reason, logged at a bounded rate) instead of memberlist's log line per
// datagram, and memberlist never sees it.
//
// Datagrams are checked by one goroutine between the transport's channel
// and memberlist's. Streams, accepted and dialed alike, are checked on
// their first Read, on memberlist's own goroutine and under its deadline.
type screenTransport struct {
	memberlist.NodeAwareTransport
	key    []byte // the cluster key; nil: gossip is plaintext
	refuse func(what string, from net.Addr, r *rejection)

	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{} // closed: stop passing input to memberlist
	drained chan struct{} // closed: stop draining the transport's channels
	stop    sync.Once
	wg      sync.WaitGroup
}

// newScreenTransport wraps t; stop it with Shutdown, or with detach if t
// is to live on.
func newScreenTransport(t memberlist.NodeAwareTransport, key []byte, refuse func(string, net.Addr, *rejection)) *screenTransport {
	g := &screenTransport{NodeAwareTransport: t, key: key, refuse: refuse,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{}),
		drained: make(chan struct{})}
	g.wg.Add(2)
	go g.forwardPackets()
	go g.forwardStreams()
	return g
}

func (g *screenTransport) PacketCh() <-chan *memberlist.Packet { return g.packets }
func (g *screenTransport) StreamCh() <-chan net.Conn           { return g.streams }

func (g *screenTransport) forwardPackets() {
	defer g.wg.Done()
	in := g.NodeAwareTransport.PacketCh()
	for {
		select {
		case <-g.done:
			g.drain()
			return
		case p := <-in:
			if r := checkPacket(p.Buf, g.key); r != nil {
				g.refuse("datagram", p.From, r)
				continue
			}
			select {
			case g.packets <- p:
			case <-g.done:
				g.drain()
				return
			}
		}
	}
}

func (g *screenTransport) forwardStreams() {
	defer g.wg.Done()
	in := g.NodeAwareTransport.StreamCh()
	for {
		select {
		case <-g.done:
			return
		case c := <-in:
			select {
			case g.streams <- g.check(c):
			case <-g.done:
				c.Close()
				return
			}
		}
	}
}

// drain discards the transport's input until drained is closed: its
// listeners hand datagrams and streams over unbuffered channels, and its
// Shutdown waits for them, so one must be read while it closes.
func (g *screenTransport) drain() {
	packets, streams := g.NodeAwareTransport.PacketCh(), g.NodeAwareTransport.StreamCh()
	for {
		select {
		case <-g.drained:
			return
		case <-packets:
		case c := <-streams:
			c.Close()
		}
	}
}

func (g *screenTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := g.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return g.check(c), nil
}

func (g *screenTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// detach stops the screen's goroutines, leaving the transport open.
func (g *screenTransport) detach() {
	g.stop.Do(func() { close(g.done); close(g.drained) })
	g.wg.Wait()
}

// Shutdown stops passing input on, shuts the transport down while its
// channels are drained, then stops the screen's goroutines.
func (g *screenTransport) Shutdown() error {
	var err error
	g.stop.Do(func() {
		close(g.done)
		err = g.NodeAwareTransport.Shutdown()
		close(g.drained)
	})
	g.wg.Wait()
	return err
}

func (g *screenTransport) check(c net.Conn) net.Conn { return &checkedConn{Conn: c, g: g} }

// checkedConn is a stream whose first message is checked before memberlist
// reads it. A refused stream reads as empty (io.EOF), which memberlist
// drops without a word. Only memberlist's stream goroutine reads it.
type checkedConn struct {
	net.Conn
	g       *screenTransport
	checked bool
	err     error  // the check's failure, returned by every Read
	pending []byte // bytes read for the check, not yet handed on
}

func (c *checkedConn) Read(p []byte) (int, error) {
	if !c.checked {
		c.checked = true
		c.pending, c.err = c.g.readHead(c.Conn)
	}
	if c.err != nil {
		return 0, c.err
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// readHead reads and checks the start of a stream, as readStream reads it:
// the type byte and, in an encrypted cluster, the whole encrypted message
// (length-prefixed, at most mlMaxStreamPayload, which memberlist would
// read as well). It returns what it read, or io.EOF once it reported a
// refusal.
func (g *screenTransport) readHead(conn net.Conn) ([]byte, error) {
	head := make([]byte, 1, 5)
	if _, err := io.ReadFull(conn, head); err != nil {
		return nil, err
	}
	if g.key == nil {
		if head[0] == mlEncrypt {
			return nil, g.refuseStream(conn, reject(RejectDecrypt, "encrypted stream, and this cluster has no key"))
		}
		if err := g.refuseStream(conn, checkStreamType(head[0])); err != nil {
			return nil, err
		}
		return head, nil
	}
	if head[0] != mlEncrypt {
		return nil, g.refuseStream(conn, reject(RejectPlain, "plaintext stream in an encrypted cluster"))
	}
	head = head[:5]
	if _, err := io.ReadFull(conn, head[1:]); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return nil, g.refuseStream(conn, reject(RejectMalformed, "encrypted stream cut short"))
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > mlMaxStreamPayload {
		return nil, g.refuseStream(conn, reject(RejectMalformed, "encrypted stream of %d bytes", n))
	}
	msg := make([]byte, 5+int(n))
	copy(msg, head)
	if _, err := io.ReadFull(conn, msg[5:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, g.refuseStream(conn, reject(RejectMalformed, "encrypted stream cut short"))
		}
		return nil, err
	}
	plain, err := openPayload(g.key, msg[5:], msg[:5])
	if err != nil {
		return nil, g.refuseStream(conn, reject(RejectDecrypt, "stream: %v", err))
	}
	if err := g.refuseStream(conn, checkStreamType(plain[0])); err != nil {
		return nil, err
	}
	return msg, nil
}

// refuseStream reports r, if any, and turns it into the io.EOF memberlist
// takes silently.
func (g *screenTransport) refuseStream(conn net.Conn, r *rejection) error {
	if r == nil {
		return nil
	}
	g.refuse("stream", conn.RemoteAddr(), r)
	return io.EOF
}
