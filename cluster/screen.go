package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
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
// and memberlist's. An accepted stream is checked before memberlist gets
// it, by a goroutine of its own, which gives it headWait to send its whole
// first message, with a key or without (without, memberlist would take a
// stream after its type byte and wait out its own timeout). At most maxPendingPerSource streams from one address wait so at
// once (a transport without addresses, as in tests, has no such bound),
// and maxPendingStreams in all from addresses that are not members';
// the rest are closed at once. So connections held open to the gossip
// port cost neither memberlist's goroutines and 10 s timeouts nor its
// ERROR line each, cannot exhaust the plugin's file descriptors, and do
// not crowd out the members' streams. A dialed stream is checked on its
// first Read, on memberlist's goroutine and under its deadline.
type screenTransport struct {
	memberlist.NodeAwareTransport
	keys   *keyring
	refuse func(what string, from net.Addr, r *rejection)

	packets chan *memberlist.Packet
	streams chan net.Conn
	// sessionLog, once acceptSessions set it, is yamux's logger, and
	// sessions from members are taken (streampool.go); muxed carries their
	// streams to forwardStreams, to be checked as accepted streams are. It
	// is stored after memberAt, adopt and deliver: a Load that finds it
	// set publishes them.
	sessionLog atomic.Pointer[log.Logger]
	muxed      chan net.Conn
	// memberAt says whether an address is a member's gossip address;
	// adopt keeps a session taken from it as this node's to it. Set
	// before the transport is used.
	memberAt func(netip.AddrPort) bool
	adopt    func(addr string, sess *session)
	// channels is the cluster's side of the channels accepted
	// (channel.go); without deliver they are left to memberlist, which
	// refuses their first message.
	channels channelSink
	// member says whether an address is a member's gossip address.
	member func(netip.Addr) bool
	// checked gets each accepted stream whose check ended, for
	// forwardStreams' counts; headWait bounds the check.
	checked  chan admitted
	headWait time.Duration
	// ctx ends with done: it closes the streams being checked.
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{} // closed: stop passing input to memberlist
	drained chan struct{} // closed: stop draining the transport's channels
	stop    sync.Once
	wg      sync.WaitGroup
}

const (
	// maxPendingPerSource and maxPendingStreams bound the accepted streams
	// not yet checked, from one address and from non-members in all: a
	// member opens one or two at once (push/pull, the plugin's messages),
	// a cluster never this many.
	maxPendingPerSource = 8
	maxPendingStreams   = 256
	// streamHeadWait is how long an accepted stream has to send its first
	// message; members send it as soon as they connect.
	streamHeadWait = 5 * time.Second
)

// newScreenTransport wraps t; stop it with Shutdown, or with detach if t
// is to live on.
// member may be nil (nobody is a member).
func newScreenTransport(t memberlist.NodeAwareTransport, keys *keyring, refuse func(string, net.Addr, *rejection),
	member func(netip.Addr) bool) *screenTransport {
	if member == nil {
		member = func(netip.Addr) bool { return false }
	}
	g := &screenTransport{NodeAwareTransport: t, keys: keys, refuse: refuse, member: member,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), muxed: make(chan net.Conn), done: make(chan struct{}),
		drained: make(chan struct{}), checked: make(chan admitted, maxPendingStreams), headWait: streamHeadWait}
	g.ctx, g.cancel = context.WithCancel(context.Background())
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
			plain, r := checkPacket(p.Buf, g.keys)
			if r != nil {
				g.refuse("datagram", p.From, r)
				continue
			}
			// A copy: the transport may still read the one it handed over.
			q := *p
			q.Buf = plain
			p = &q
			select {
			case g.packets <- p:
			case <-g.done:
				g.drain()
				return
			}
		}
	}
}

// forwardStreams admits the accepted streams, and the streams of the
// sessions taken, to their check; it alone keeps the counts of those
// being checked, by source.
func (g *screenTransport) forwardStreams() {
	defer g.wg.Done()
	in := g.NodeAwareTransport.StreamCh()
	p := pendingStreams{perSource: map[netip.Addr]int{}}
	for {
		select {
		case <-g.done:
			return
		case a := <-g.checked:
			if p.perSource[a.source]--; p.perSource[a.source] == 0 {
				delete(p.perSource, a.source)
			}
			if a.stranger {
				p.strangers--
			}
		case c := <-g.muxed:
			g.admit(&p, c)
		case c := <-in:
			g.admit(&p, c)
		}
	}
}

// pendingStreams counts the streams being checked; forwardStreams' own.
type pendingStreams struct {
	perSource map[netip.Addr]int
	strangers int // from non-members
}

// admit starts c's check, or refuses c over the bounds.
func (g *screenTransport) admit(p *pendingStreams, c net.Conn) {
	a := sourceOf(c.RemoteAddr())
	member := g.member(a)
	var full string
	switch {
	case a.IsValid() && p.perSource[a] >= maxPendingPerSource:
		full = fmt.Sprintf("%d streams from %s are being checked already", maxPendingPerSource, a)
	case !member && p.strangers >= maxPendingStreams:
		full = fmt.Sprintf("%d streams from non-members are being checked already", maxPendingStreams)
	}
	if full != "" {
		g.refuse("stream", c.RemoteAddr(), reject(RejectStreamLimit, "%s", full))
		c.Close()
		return
	}
	p.perSource[a]++
	if !member {
		p.strangers++
	}
	g.wg.Add(1)
	go g.checkAccepted(c, admitted{a, !member})
}

// admitted is an accepted stream being checked: its source, and whether
// it counts among the non-members'.
type admitted struct {
	source   netip.Addr
	stranger bool
}

// sourceOf is a remote address's IP (unmapped), zero if it has none.
func sourceOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(a.String()) // another transport's address
	return ap.Addr().Unmap()
}

// checkAccepted checks an accepted stream's first message within headWait
// and hands the stream to memberlist, or closes it.
func (g *screenTransport) checkAccepted(c net.Conn, a admitted) {
	defer g.wg.Done()
	defer func() {
		select {
		case g.checked <- a:
		case <-g.done: // forwardStreams is gone
		}
	}()
	stop := context.AfterFunc(g.ctx, func() { c.Close() })
	defer stop()
	if err := c.SetReadDeadline(time.Now().Add(g.headWait)); err != nil {
		c.Close()
		return
	}
	head, err := g.readHead(c, true)
	if errors.Is(err, errSessionPreface) {
		g.takeSession(c, a, head)
		return
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			g.refuse("stream", c.RemoteAddr(), reject(RejectStreamIdle, "no whole first message within %v", g.headWait))
		}
		c.Close()
		return
	}
	if addr, ok := channelFrom(head); ok {
		// Not counted when refused, as a session is not: a node that just
		// joined, or came back, dials before every member took in its
		// alive message. It sends by SendReliable meanwhile.
		var name string
		ok := false
		if g.sessionLog.Load() != nil && g.channels.deliver != nil && !a.stranger {
			name, ok = g.channels.from(addr, a.source)
		}
		if !ok {
			c.Close()
			return
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serveChannel(c, name)
		}()
		return
	}
	// The head is read: the rest is memberlist's, under its own deadline.
	// (A peer that closed after writing makes some conns, net.Pipe among
	// them, refuse deadlines from then on: checkedConn overlooks that.)
	_ = c.SetReadDeadline(time.Time{})
	select {
	case g.streams <- &checkedConn{Conn: c, g: g, checked: true, pending: head}:
	case <-g.done:
		c.Close()
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
	g.stop.Do(func() { close(g.done); g.cancel(); close(g.drained) })
	g.wg.Wait()
}

// Shutdown stops passing input on, shuts the transport down while its
// channels are drained, then stops the screen's goroutines.
func (g *screenTransport) Shutdown() error {
	var err error
	g.stop.Do(func() {
		close(g.done)
		g.cancel()
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

// SetDeadline, SetReadDeadline: a stream whose head was read ahead can
// still be read to its end when its peer has closed it, whatever the
// underlying conn says of deadlines then (net.Pipe refuses them), so such
// an error is not passed on while read-ahead bytes remain.
func (c *checkedConn) SetDeadline(t time.Time) error {
	return c.pendingOK(c.Conn.SetDeadline(t))
}

func (c *checkedConn) SetReadDeadline(t time.Time) error {
	return c.pendingOK(c.Conn.SetReadDeadline(t))
}

func (c *checkedConn) pendingOK(err error) error {
	if err != nil && len(c.pending) > 0 {
		return nil
	}
	return err
}

func (c *checkedConn) Read(p []byte) (int, error) {
	if !c.checked {
		c.checked = true
		c.pending, c.err = c.g.readHead(c.Conn, false)
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

// readHead reads and checks the start of a stream, as memberlist would
// read it: the type byte and, in an encrypted cluster, the whole encrypted
// message (length-prefixed, at most mlMaxStreamPayload, which memberlist
// would read as well). An accepted stream's plaintext message is read
// whole too (mlstream.go), so that memberlist gets no stream before its
// first message is in, whether or not the cluster has a key; a dialed
// stream's answer is memberlist's to read, under its deadline. readHead
// returns what it read, or io.EOF once it reported a refusal; an error of
// the conn (a timeout, a stream closed or empty) is returned as it is.
// In an encrypted cluster what it returns is the message decrypted.
func (g *screenTransport) readHead(conn net.Conn, accepted bool) ([]byte, error) {
	h := &headReader{r: conn, max: maxHead}
	msg, err := g.readFrom(h, conn, accepted)
	if err != nil || g.keys.encrypted {
		return msg, err
	}
	return h.buf, nil // with what was read past the message: memberlist reads on
}

// readMessage reads and checks a channel's next message (readFrom), and
// returns it, decrypted; h keeps what was read past it.
func (g *screenTransport) readMessage(h *headReader, conn net.Conn) ([]byte, error) {
	return g.readFrom(h, conn, true)
}

// readFrom is readHead's, on h; in plaintext it returns the message alone
// (h.buf[:h.pos]), or the type byte of a dialed stream's answer.
func (g *screenTransport) readFrom(h *headReader, conn net.Conn, accepted bool) ([]byte, error) {
	types := answerTypes
	if accepted {
		types = requestTypes
	}
	t, err := h.take(1)
	if err != nil {
		return nil, err
	}
	if accepted && t[0] == muxPreface {
		return h.buf, errSessionPreface
	}
	if !g.keys.encrypted {
		if t[0] == mlEncrypt {
			return nil, g.refuseStream(conn, reject(RejectDecrypt, "encrypted stream, and this cluster has no key"))
		}
		if err := g.refuseStream(conn, checkStreamType(t[0], types)); err != nil {
			return nil, err
		}
		if accepted {
			if err := h.plainMessage(t[0]); err != nil {
				return nil, g.headError(h, conn, err)
			}
		}
		return h.buf[:h.pos], nil
	}
	if t[0] != mlEncrypt {
		return nil, g.refuseStream(conn, reject(RejectPlain, "plaintext stream in an encrypted cluster"))
	}
	aad, payload, err := h.encryptedMessage()
	if err != nil {
		return nil, g.headError(h, conn, err)
	}
	plain, err := g.keys.open(payload, aad)
	if err != nil {
		return nil, g.refuseStream(conn, reject(RejectDecrypt, "stream: %v", err))
	}
	if err := g.refuseStream(conn, checkStreamType(plain[0], types)); err != nil {
		return nil, err
	}
	// memberlist gets the plaintext message (its type, then its body) and
	// takes it as it is: GossipVerifyIncoming is off (New), since every
	// stream's first message, and a stream carries one each way, is
	// checked here. So each is decrypted once.
	return plain, nil
}

// maxHead bounds what readHead reads: an encrypted message's type, length
// and payload; a plaintext first message, whose parts memberlist bounds
// one by one, is held to the same.
const maxHead = 5 + mlMaxStreamPayload

// headError reports a first message that is malformed, too long or cut
// short, and returns the conn's other errors as they are.
func (g *screenTransport) headError(h *headReader, conn net.Conn, err error) error {
	var r *rejection
	switch {
	case errors.As(err, &r):
		return g.refuseStream(conn, r)
	case errors.Is(err, errHeadTooLong):
		return g.refuseStream(conn, reject(RejectMalformed, "first message over %d bytes", maxHead))
	case errors.Is(err, io.ErrUnexpectedEOF) && h.channel:
		return io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return g.refuseStream(conn, reject(RejectMalformed, "stream cut short"))
	}
	return err
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
