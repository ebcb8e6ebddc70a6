package cluster

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// session is a yamux session (streampool.go) and its connection, with
// guards against yamux v0.1.2's spin at shutdown (hashicorp/yamux#176):
// a stream's Read or Write blocked when its session shuts down loops on
// the closed shutdown channel until the stream is marked closed, and
// Session.Close marks them only after its reader and writer stopped. With
// a hundred channels read at once (channel.go), the spinning readers
// starved the very goroutines Close waited for: closing 100 hosts in one
// process took 22 s of CPU. So before a session shuts down, every stream
// it carries gets a deadline in the past, and a blocked Read or Write
// returns: end does that, then closes the connection (never Close);
// the connection's reader does it before it reports the error that makes
// yamux shut the session down (the other end closed, or end did); watch
// does it too, for a shutdown that began elsewhere (a failed write).
type session struct {
	*yamux.Session
	conn net.Conn

	// mu guards streams and dead, and a stream's deadlines. A leaf.
	mu      lockrank.Mutex[lockrank.SessionMu]
	streams map[*sessionStream]struct{} // the streams not closed yet
	dead    bool                        // shut down: deadlines are in the past
}

// expired is the deadline of a dead session's streams.
var expired = time.Unix(1, 0)

// startSession starts a yamux session on conn, as start (yamux.Client or
// yamux.Server) does, its connection read through sessionConn.
func startSession(conn net.Conn, start func(io.ReadWriteCloser, *yamux.Config) (*yamux.Session, error), cfg *yamux.Config) (*session, error) {
	sc := &sessionConn{Conn: conn}
	ys, err := start(sc, cfg)
	if err != nil {
		return nil, err
	}
	s := &session{Session: ys, conn: conn, streams: map[*sessionStream]struct{}{}}
	sc.s.Store(s)
	go s.watch()
	return s, nil
}

// end shuts the session down: its streams' deadlines expire, then its
// connection closes.
func (s *session) end() {
	s.expire()
	s.conn.Close()
}

// watch expires the streams' deadlines once the session is shut down.
func (s *session) watch() {
	<-s.CloseChan()
	s.expire()
}

func (s *session) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	for st := range s.streams {
		st.Stream.SetDeadline(expired)
	}
	clear(s.streams)
}

// sessionConn is a session's connection as yamux reads it: a read error,
// which makes yamux shut the session down, first expires the streams.
type sessionConn struct {
	net.Conn
	s atomic.Pointer[session] // nil until startSession stored it
}

func (c *sessionConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		if s := c.s.Load(); s != nil {
			s.expire()
		}
	}
	return n, err
}

// wrap makes st one of the session's streams.
func (s *session) wrap(st *yamux.Stream) *sessionStream {
	ss := &sessionStream{Stream: st, sess: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		st.SetDeadline(expired)
	} else {
		s.streams[ss] = struct{}{}
	}
	return ss
}

// sessionStream is a session's stream. A failed write ends the session,
// whose connection is broken or stuck; a deadline set once the session is
// dead stays in the past.
type sessionStream struct {
	*yamux.Stream
	sess *session
}

func (ss *sessionStream) Write(b []byte) (int, error) {
	n, err := ss.Stream.Write(b)
	if err != nil && !errors.Is(err, yamux.ErrStreamClosed) {
		ss.sess.end()
	}
	return n, err
}

func (ss *sessionStream) Close() error {
	ss.sess.mu.Lock()
	delete(ss.sess.streams, ss)
	ss.sess.mu.Unlock()
	return ss.Stream.Close()
}

func (ss *sessionStream) SetDeadline(t time.Time) error {
	return ss.deadline(t, ss.Stream.SetDeadline)
}

func (ss *sessionStream) SetReadDeadline(t time.Time) error {
	return ss.deadline(t, ss.Stream.SetReadDeadline)
}

func (ss *sessionStream) SetWriteDeadline(t time.Time) error {
	return ss.deadline(t, ss.Stream.SetWriteDeadline)
}

func (ss *sessionStream) deadline(t time.Time, set func(time.Time) error) error {
	ss.sess.mu.Lock()
	defer ss.sess.mu.Unlock()
	if ss.sess.dead {
		t = expired
	}
	return set(t)
}
