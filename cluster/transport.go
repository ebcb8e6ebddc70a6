package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// abortableTransport is memberlist's UDP+TCP transport whose streams end
// when the cluster closes. memberlist dials with a plain timeout (its
// TCPTimeout, 10 s) and gives a stream that long to complete, so a push,
// an anti-entropy answer or a rejoin attempt to a member that stopped
// answering held Close, and with it the plugin's SIGTERM, for ten seconds.
// Here every dial takes the cluster's context and every open stream is
// closed when it is cancelled.
//
// Its streams leave from the address the node advertises: the others
// tell members from strangers by a stream's source (screen.go), and the
// kernel would otherwise pick the route's, which on a multi-homed host,
// or on loopback, is another. Where that address is not local (behind
// NAT) the kernel's pick stands.
type abortableTransport struct {
	*memberlist.NetTransport
	ctx    context.Context
	source atomic.Pointer[net.TCPAddr] // nil: the kernel picks
	// pool carries the streams to members that take sessions
	// (streampool.go); nil: every stream is a connection of its own.
	pool *streamPool
}

// newAbortableTransport binds memberlist's transport as memberlist would
// (retrying a port-0 bind, which races between UDP and TCP) and reports
// the port it got.
func newAbortableTransport(ctx context.Context, mc *memberlist.Config) (*abortableTransport, error) {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{mc.BindAddr},
		BindPort:  mc.BindPort,
		Logger:    mc.Logger,
	}
	tries := 1
	if mc.BindPort == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			if mc.BindPort == 0 {
				mc.BindPort = nt.GetAutoBindPort()
				mc.AdvertisePort = mc.BindPort
			}
			t := &abortableTransport{NetTransport: nt, ctx: ctx}
			if ip := net.ParseIP(mc.AdvertiseAddr); ip != nil && !ip.IsUnspecified() {
				t.source.Store(&net.TCPAddr{IP: ip})
			}
			return t, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("bind gossip port: %w", err)
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
