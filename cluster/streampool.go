package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Multiplexed streams. memberlist dials a TCP connection for every stream
// and closes it after one message: every push, anti-entropy message,
// push/pull and fallback ping. In a 100-host rollout that was ~40% of the
// CPU (connect, accept, close, and the kernel's handshakes and
// TIME_WAITs), for messages of a few hundred bytes. Pushes and
// anti-entropy now go over channels (channel.go); for memberlist's own
// streams a node keeps one TCP connection per member it sends to and
// carries them over it as yamux streams, which memberlist and the screen
// take as they took connections: each stream still carries one message
// each way, checked, and encrypted with the cluster's key, as before.
//
// A session starts with muxPreface and the dialer's gossip address (a
// byte of length, then host:port); the acceptor answers muxPreface if it
// takes it (it speaks wireMux, and the address is a member's, from which
// the connection came), or closes. The dialer waits for that answer
// before the session carries anything, so a refusal never loses a
// message: the stream is dialed plain, as to a 0.1.0 node, and that
// address gets plain streams for muxRetry. Sessions are dialed only to
// members that speak wireMux. Either end opens streams on a session: the
// acceptor keeps it as its session to the dialer, so a pair of members
// holds one connection, not two (a host's descriptors, and the yamux
// buffers and goroutines, grow with its members).
//
// A session ends when the cluster closes, when its member leaves or
// restarts (forget), after muxIdle without a stream, or on any error of
// its connection: the next stream dials a new one. A stream's write that
// fails (a connection stuck behind a partition times out) ends its
// session too.
const (
	// muxPreface opens a session: no memberlist message type has it.
	muxPreface byte = 0xfa
	// wireMux is the first wire version whose nodes take sessions.
	wireMux = 3
	// muxRetry is how long an address that refused a session gets plain
	// streams.
	muxRetry = 30 * time.Second
	// muxIdle closes a session that carried no stream that long.
	muxIdle = 2 * time.Minute
)

// muxConfig is yamux's configuration for both ends: no keepalive (the
// member's liveness is memberlist's to judge; forget ends a dead one's
// session) and no open timeout (its goroutine per stream cost more than
// the stream).
func muxConfig(logger *log.Logger) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.StreamOpenTimeout = 0
	cfg.LogOutput = nil
	cfg.Logger = logger
	if logger == nil {
		cfg.LogOutput = io.Discard
	}
	return cfg
}

// streamPool holds the sessions this node dialed, by remote address.
type streamPool struct {
	ctx    context.Context
	dial   func(addr string, timeout time.Duration) (net.Conn, error) // a plain TCP stream
	muxOK  func(name string) bool                                     // the member speaks wireMux; lock-free
	logger *log.Logger
	// serve accepts the streams the other end opens on a session this
	// node dialed (screenTransport.serveSession); self is this node's
	// gossip address, sent in the preface (nil until known: plain
	// streams). Both are set before the first dial.
	serve func(*session)
	self  atomic.Pointer[string]

	// mu guards sessions and plain. A leaf: nothing is called with it
	// held but map and channel operations.
	mu       lockrank.Mutex[lockrank.StreamPool]
	sessions map[string]*poolSession
	plain    map[string]time.Time // address → until when it gets plain streams

	// Counts for Stats: sessions dialed, streams opened over one, streams
	// dialed as connections of their own.
	dialed, muxed, plainDials atomic.Uint64
}

// poolSession is a session being dialed (ready open) or up.
type poolSession struct {
	ready chan struct{} // closed once sess or err is set
	sess  *session
	err   error
	used  atomic.Int64 // unix nanoseconds of the last stream opened
}

func newStreamPool(ctx context.Context, dial func(string, time.Duration) (net.Conn, error), muxOK func(string) bool, logger *log.Logger) *streamPool {
	p := &streamPool{ctx: ctx, dial: dial, muxOK: muxOK, logger: logger,
		sessions: map[string]*poolSession{}, plain: map[string]time.Time{}}
	go p.closeIdle()
	return p
}

// open returns a stream to member name at addr: a session's if the member
// takes them, else a plain connection.
func (p *streamPool) open(name, addr string, timeout time.Duration) (net.Conn, error) {
	st, err := p.openSession(name, addr, timeout)
	if errors.Is(err, errNoSession) || errors.Is(err, errMuxRefused) {
		return p.dialOwn(addr, timeout)
	}
	return st, err
}

// openSession returns a stream on a session to member name at addr, or
// errNoSession where it would be a connection of its own. A session found
// closed is dialed again, once.
func (p *streamPool) openSession(name, addr string, timeout time.Duration) (net.Conn, error) {
	if name == "" || p.self.Load() == nil || !p.muxOK(name) || p.plainFor(addr) {
		return nil, errNoSession
	}
	for range 2 {
		ps, err := p.session(addr, timeout)
		if err != nil {
			return nil, err
		}
		st, err := ps.sess.OpenStream()
		if err == nil {
			ps.used.Store(time.Now().UnixNano())
			p.muxed.Add(1)
			return ps.sess.wrap(st), nil
		}
		p.drop(addr, ps)
	}
	return nil, errNoSession
}

var errNoSession = errors.New("the member takes no session")

func (p *streamPool) dialOwn(addr string, timeout time.Duration) (net.Conn, error) {
	p.plainDials.Add(1)
	return p.dial(addr, timeout)
}

func (p *streamPool) plainFor(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.plain[addr]
	if ok && time.Now().After(until) {
		delete(p.plain, addr)
		return false
	}
	return ok
}

// session returns addr's session, dialing it if there is none; callers
// that find it being dialed wait for that dial.
func (p *streamPool) session(addr string, timeout time.Duration) (*poolSession, error) {
	p.mu.Lock()
	ps := p.sessions[addr]
	if ps != nil {
		p.mu.Unlock()
		select {
		case <-ps.ready:
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
		if ps.err != nil {
			return nil, ps.err
		}
		if ps.sess.IsClosed() {
			p.drop(addr, ps)
			return p.session(addr, timeout)
		}
		return ps, nil
	}
	ps = &poolSession{ready: make(chan struct{})}
	p.sessions[addr] = ps
	p.mu.Unlock()

	ps.sess, ps.err = p.dialSession(addr, timeout)
	ps.used.Store(time.Now().UnixNano())
	close(ps.ready)
	if ps.err != nil {
		p.drop(addr, ps)
		if errors.Is(ps.err, errMuxRefused) {
			p.mu.Lock()
			p.plain[addr] = time.Now().Add(muxRetry)
			p.mu.Unlock()
		}
	}
	return ps, ps.err
}

var errMuxRefused = errors.New("session refused")

// dialSession dials addr and opens a session on it.
func (p *streamPool) dialSession(addr string, timeout time.Duration) (*session, error) {
	conn, err := p.dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	if err := muxHandshake(conn, *p.self.Load(), time.Now().Add(timeout)); err != nil {
		conn.Close()
		return nil, err
	}
	sess, err := startSession(conn, yamux.Client, muxConfig(p.logger))
	if err != nil {
		conn.Close()
		return nil, err
	}
	p.dialed.Add(1)
	p.serve(sess)
	return sess, nil
}

// muxHandshake sends the preface and waits for the acceptor's.
func muxHandshake(conn net.Conn, self string, deadline time.Time) error {
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := conn.Write(append([]byte{muxPreface, byte(len(self))}, self...)); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return errMuxRefused
		}
		return err
	}
	if b[0] != muxPreface {
		return fmt.Errorf("%w: answered %#x", errMuxRefused, b[0])
	}
	return conn.SetDeadline(time.Time{})
}

// drop removes ps, if it is still addr's, and closes its session.
func (p *streamPool) drop(addr string, ps *poolSession) {
	p.mu.Lock()
	if p.sessions[addr] == ps {
		delete(p.sessions, addr)
	}
	p.mu.Unlock()
	if ps.sess != nil {
		ps.sess.end()
	}
}

// adopt makes a session a member dialed to this node, from its gossip
// address addr, this node's session to it, unless it has one up.
func (p *streamPool) adopt(addr string, sess *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.sessions[addr]; ps != nil {
		select {
		case <-ps.ready:
			if ps.sess != nil && !ps.sess.IsClosed() {
				return
			}
		default:
			return // being dialed: that one is kept
		}
	}
	ps := &poolSession{ready: make(chan struct{}), sess: sess}
	ps.used.Store(time.Now().UnixNano())
	close(ps.ready)
	p.sessions[addr] = ps
}

// forget closes the session to addr: its member left or restarted.
func (p *streamPool) forget(addr string) {
	p.mu.Lock()
	ps := p.sessions[addr]
	delete(p.plain, addr)
	p.mu.Unlock()
	if ps != nil {
		select {
		case <-ps.ready:
			p.drop(addr, ps)
		default: // being dialed: the dial's error or its first stream tells
		}
	}
}

// closeIdle ends sessions unused for muxIdle, and every session when the
// cluster closes.
func (p *streamPool) closeIdle() {
	t := time.NewTicker(muxIdle / 4)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			p.mu.Lock()
			all := p.sessions
			p.sessions = map[string]*poolSession{}
			p.mu.Unlock()
			for addr, ps := range all {
				<-ps.ready // a dial under way ends with the context
				p.drop(addr, ps)
			}
			return
		case <-t.C:
		}
		idle := time.Now().Add(-muxIdle).UnixNano()
		p.mu.Lock()
		var old []*poolSession
		for addr, ps := range p.sessions {
			select {
			case <-ps.ready:
			default:
				continue
			}
			if ps.sess == nil || ps.sess.NumStreams() == 0 && ps.used.Load() < idle {
				delete(p.sessions, addr)
				old = append(old, ps)
			}
		}
		p.mu.Unlock()
		for _, ps := range old {
			if ps.sess != nil {
				ps.sess.end()
			}
		}
	}
}

// sessionsChanged follows a change of member name: its wire version
// (0: it left) decides whether streams to it go by session, and its
// session at addr, from before the change, ends. Caller holds c.mu; the
// session is closed on a goroutine of its own, since closing waits for
// its reader.
func (c *Cluster) sessionsChanged(name string, wire byte, addr netip.AddrPort) {
	if wire >= wireMux {
		c.muxPeers.Store(name, struct{}{})
	} else {
		c.muxPeers.Delete(name)
	}
	if c.pool != nil {
		go func() {
			c.closeChannel(name)
			if addr.IsValid() {
				c.pool.forget(addr.String())
			}
		}()
	}
}

// takesSessions says whether member name takes sessions.
func (c *Cluster) takesSessions(name string) bool {
	_, ok := c.muxPeers.Load(name)
	return ok
}

// errSessionPreface: an accepted connection opens a session.
var errSessionPreface = errors.New("session preface")

// acceptSessions makes the screen take sessions from members, and serve
// those pool dials.
func (g *screenTransport) acceptSessions(logger *log.Logger, memberAt func(netip.AddrPort) bool, pool *streamPool, channels channelSink) {
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	g.memberAt, g.adopt, g.channels = memberAt, pool.adopt, channels
	pool.serve = func(s *session) { go g.serveSession(s) }
	g.sessionLog.Store(logger)
}

// takeSession answers an accepted connection's session preface (head,
// as read so far): a member's session is taken, its streams passed to
// forwardStreams one by one, and it becomes this node's session to that
// member; anybody else's is refused.
func (g *screenTransport) takeSession(c net.Conn, a admitted, head []byte) {
	logger := g.sessionLog.Load()
	from, err := sessionPeer(c, head)
	switch {
	case logger == nil:
		g.refuse("stream", c.RemoteAddr(), reject(RejectUnknownType, "session preface, and this node takes no sessions"))
	case err != nil:
		g.refuse("stream", c.RemoteAddr(), reject(RejectMalformed, "session preface: %v", err))
	case a.stranger || from.Addr() != a.source || !g.memberAt(from):
		// Not counted: a node that just joined dials before every member
		// took in its alive message. It gets plain streams meanwhile.
	default:
		if err := c.SetReadDeadline(time.Time{}); err != nil {
			break
		}
		if err := c.SetWriteDeadline(time.Now().Add(g.headWait)); err != nil {
			break
		}
		if _, err := c.Write([]byte{muxPreface}); err != nil {
			break
		}
		_ = c.SetWriteDeadline(time.Time{})
		sess, err := startSession(c, yamux.Server, muxConfig(logger))
		if err != nil {
			break
		}
		if g.adopt != nil {
			g.adopt(from.String(), sess)
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serveSession(sess)
		}()
		return
	}
	c.Close()
}

// sessionPeer reads the rest of a session preface, of which head was
// read, and returns the gossip address it gives.
func sessionPeer(c net.Conn, head []byte) (netip.AddrPort, error) {
	h := &headReader{r: c, buf: head, max: 2 + 255}
	if err := h.fill(2); err != nil {
		return netip.AddrPort{}, err
	}
	n := 2 + int(h.buf[1])
	if err := h.fill(n); err != nil {
		return netip.AddrPort{}, err
	}
	if len(h.buf) != n { // the dialer waits for the answer
		return netip.AddrPort{}, errors.New("followed by data")
	}
	ap, err := netip.ParseAddrPort(string(h.buf[2:n]))
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), err
}

// serveSession passes a session's streams on until it or the screen
// ends: the sessions this node took, and those it dialed (whose other
// end opens streams too).
func (g *screenTransport) serveSession(sess *session) {
	stop := context.AfterFunc(g.ctx, sess.end)
	defer stop()
	defer sess.end()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case g.muxed <- sess.wrap(st):
		case <-g.done:
			st.Close()
			return
		}
	}
}
