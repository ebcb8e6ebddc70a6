package health

import (
	"net"
	"net/netip"
	"sync"
)

// fakeNet carries datagrams between fake endpoints, per path, dropping
// what its rules say: a blocked path between two hosts (both ways), or
// datagrams above a size.
type fakeNet struct {
	mu      sync.Mutex
	conns   map[netip.AddrPort]map[Path]*fakeConn
	blocked map[Path]bool
	maxSize map[Path]int // the largest IP packet that crosses, 0: any
	// maxFrom is the largest IP packet that crosses from one host, 0: any.
	maxFrom map[netip.Addr]int
	sent    map[Path]int // datagrams written, by path
}

func newFakeNet() *fakeNet {
	return &fakeNet{conns: map[netip.AddrPort]map[Path]*fakeConn{}, blocked: map[Path]bool{},
		maxSize: map[Path]int{}, maxFrom: map[netip.Addr]int{}, sent: map[Path]int{}}
}

type datagram struct {
	b    []byte
	from netip.AddrPort
}

type fakeConn struct {
	net    *fakeNet
	path   Path
	local  netip.AddrPort
	in     chan datagram
	closed chan struct{}
	once   sync.Once
}

func (n *fakeNet) conn(addr netip.AddrPort, path Path) *fakeConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := &fakeConn{net: n, path: path, local: addr, in: make(chan datagram, 1024), closed: make(chan struct{})}
	if n.conns[addr] == nil {
		n.conns[addr] = map[Path]*fakeConn{}
	}
	n.conns[addr][path] = c
	return c
}

func (n *fakeNet) set(f func(n *fakeNet)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n)
}

func (c *fakeConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	select {
	case d := <-c.in:
		return copy(b, d.b), d.from, nil
	case <-c.closed:
		return 0, netip.AddrPort{}, net.ErrClosed
	}
}

func (c *fakeConn) WriteToUDPAddrPort(b []byte, to netip.AddrPort) (int, error) {
	n := c.net
	n.mu.Lock()
	n.sent[c.path]++
	dst := n.conns[to][c.path]
	limit := n.maxSize[c.path]
	if m := n.maxFrom[c.local.Addr()]; m > 0 && (limit == 0 || m < limit) {
		limit = m
	}
	drop := n.blocked[c.path] || (limit > 0 && len(b)+28 > limit)
	n.mu.Unlock()
	if dst == nil || drop {
		return len(b), nil
	}
	select {
	case dst.in <- datagram{b: append([]byte(nil), b...), from: c.local}:
	default: // a full queue drops, as a socket's does
	}
	return len(b), nil
}

func (c *fakeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}
