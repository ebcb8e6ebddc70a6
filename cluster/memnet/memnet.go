// Package memnet is an in-memory network for memberlist: each Transport
// has its own ip:port, so many nodes (even with the same port on different
// IPs, as in production) run in one process.
//
// Unlike memberlist.MockNetwork it is safe to add and remove transports
// while others run, a node that is shut down (crashed) no longer blocks its
// senders (packets to it are dropped, dials to it are refused, like UDP and
// TCP), its address can be reused by a restarted node, and a filter can
// drop traffic between chosen nodes (partitions, lossy links). An optional
// one-way latency delays packets and connection setup.
package memnet

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Filter decides whether traffic from one address reaches another; stream
// is true for dials (push/pull, TCP pings), false for packets.
type Filter func(from, to netip.AddrPort, stream bool) bool

// Network connects Transports.
type Network struct {
	// mu guards nodes and filter. A leaf lock: nothing else is locked or
	// blocked on while it is held.
	mu     sync.Mutex
	nodes  map[netip.AddrPort]*Transport
	filter Filter
	// latency is the one-way delay of every link, in nanoseconds.
	latency atomic.Int64
	// hang makes filtered dials wait out their timeout (see SetHang).
	hang atomic.Bool
}

// New returns an empty network.
func New() *Network { return &Network{nodes: map[netip.AddrPort]*Transport{}} }

// SetFilter installs f (nil: deliver everything).
func (n *Network) SetFilter(f Filter) {
	n.mu.Lock()
	n.filter = f
	n.mu.Unlock()
}

// SetLatency delays every packet by d, and every dial by a round trip
// (2d, the TCP handshake); bytes on an established stream are not delayed.
// 0, the default, delivers at once.
func (n *Network) SetLatency(d time.Duration) { n.latency.Store(int64(d)) }

// SetHang says what a dial the filter blocks does: fail at once, like a
// refused connection or an unreachable network (false, the default), or
// wait out its timeout, like a TCP handshake whose packets a partition
// drops (true).
func (n *Network) SetHang(hang bool) { n.hang.Store(hang) }

// NewTransport attaches a transport at addr. The address must be free: a
// previous transport there must have been shut down.
func (n *Network) NewTransport(addr netip.AddrPort) (*Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, busy := n.nodes[addr]; busy {
		return nil, fmt.Errorf("memnet: address %s in use", addr)
	}
	t := &Transport{
		net:      n,
		addr:     addr,
		packetCh: make(chan *memberlist.Packet, 1024),
		streamCh: make(chan net.Conn, 64),
		done:     make(chan struct{}),
	}
	n.nodes[addr] = t
	return t, nil
}

var errUnreachable = errors.New("unreachable")

// route finds the live destination of from → to if the filter lets it pass.
func (n *Network) route(from netip.AddrPort, to string, stream bool) (*Transport, error) {
	ap, err := netip.ParseAddrPort(to)
	if err != nil {
		return nil, fmt.Errorf("memnet: bad address %q: %w", to, err)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	n.mu.Lock()
	defer n.mu.Unlock()
	dst := n.nodes[ap]
	if dst == nil {
		return nil, fmt.Errorf("memnet: %s: connection refused", ap)
	}
	if n.filter != nil && !n.filter(from, ap, stream) {
		return nil, fmt.Errorf("memnet: %s: %w", ap, errUnreachable)
	}
	return dst, nil
}

// Transport is one node's memberlist.NodeAwareTransport.
type Transport struct {
	net      *Network
	addr     netip.AddrPort
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	once     sync.Once

	// Counters of this transport's traffic, memberlist's included.
	PacketsSent, PacketsReceived, PacketsDropped atomic.Uint64
	BytesSent, BytesReceived                     atomic.Uint64
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Addr is the transport's address.
func (t *Transport) Addr() netip.AddrPort { return t.addr }

func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.addr.Addr().AsSlice(), int(t.addr.Port()), nil
}

func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress delivers a copy of b, or drops it (UDP semantics: no
// error) when the destination is gone, filtered or its queue is full.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	t.PacketsSent.Add(1)
	t.BytesSent.Add(uint64(len(b)))
	select {
	case <-t.done:
		return now, errors.New("memnet: transport shut down")
	default:
	}
	dst, err := t.net.route(t.addr, a.Addr, false)
	if err != nil {
		t.PacketsDropped.Add(1)
		return now, nil
	}
	p := &memberlist.Packet{Buf: bytes.Clone(b), From: net.UDPAddrFromAddrPort(t.addr), Timestamp: now}
	if d := time.Duration(t.net.latency.Load()); d > 0 {
		time.AfterFunc(d, func() { t.deliver(dst, p) })
	} else {
		t.deliver(dst, p)
	}
	return now, nil
}

// deliver queues p at dst, or drops it if dst is gone or its queue is full.
func (t *Transport) deliver(dst *Transport, p *memberlist.Packet) {
	select {
	case <-dst.done:
		t.PacketsDropped.Add(1)
	case dst.packetCh <- p:
		dst.PacketsReceived.Add(1)
		dst.BytesReceived.Add(uint64(len(p.Buf)))
	default:
		t.PacketsDropped.Add(1)
	}
}

func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout connects to the destination's stream channel, or
// fails like a refused or timed-out TCP connection.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	select {
	case <-t.done:
		return nil, errors.New("memnet: transport shut down")
	default:
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	dst, err := t.net.route(t.addr, a.Addr, true)
	if errors.Is(err, errUnreachable) && t.net.hang.Load() {
		select {
		case <-timer.C:
		case <-t.done:
		}
		return nil, fmt.Errorf("memnet: dial %s timed out", a.Addr)
	}
	if err != nil {
		return nil, err
	}
	select {
	case <-dst.done:
		return nil, fmt.Errorf("memnet: %s: connection refused", dst.addr)
	default:
	}
	if d := time.Duration(t.net.latency.Load()); d > 0 {
		select {
		case <-time.After(2 * d):
		case <-timer.C:
			return nil, fmt.Errorf("memnet: dial %s timed out", dst.addr)
		}
	}
	near, far := net.Pipe()
	ends := &pipeEnds{near: near, far: far}
	local, remote := net.TCPAddrFromAddrPort(t.addr), net.TCPAddrFromAddrPort(dst.addr)
	select {
	case dst.streamCh <- &conn{Conn: far, ends: ends, local: remote, remote: local, t: dst}:
		return &conn{Conn: near, ends: ends, local: local, remote: remote, t: t}, nil
	case <-dst.done:
	case <-t.done:
	case <-timer.C:
	}
	near.Close()
	far.Close()
	return nil, fmt.Errorf("memnet: dial %s failed", dst.addr)
}

func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown detaches the transport: its address becomes free, traffic to
// it is dropped or refused. Idempotent.
func (t *Transport) Shutdown() error {
	t.once.Do(func() {
		close(t.done)
		t.net.mu.Lock()
		if t.net.nodes[t.addr] == t {
			delete(t.net.nodes, t.addr)
		}
		t.net.mu.Unlock()
		for {
			select {
			case c := <-t.streamCh:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

// conn is one end of a stream, with TCP-looking addresses and byte counts.
type conn struct {
	net.Conn
	ends          *pipeEnds
	local, remote net.Addr
	t             *Transport
}

// pipeEnds are a stream's two ends.
type pipeEnds struct {
	once      sync.Once
	near, far net.Conn
}

// Close stops the deadline timers of both ends first: a net.Pipe leaves
// them running after Close (and an end refuses SetDeadline once the other
// closed), each holding the pipe until it fires. memberlist gives every
// stream its TCPTimeout (10 s), so at thousands of streams a (virtual)
// second the 1,000-host simulation kept gigabytes of closed pipes alive.
func (c *conn) Close() error {
	c.ends.once.Do(func() {
		c.ends.near.SetDeadline(time.Time{})
		c.ends.far.SetDeadline(time.Time{})
	})
	return c.Conn.Close()
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.t.BytesReceived.Add(uint64(n))
	return n, err
}

func (c *conn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.t.BytesSent.Add(uint64(n))
	return n, err
}

// Decoupled wraps a transport whose deliveries block the sender until the
// receiver reads (memberlist.MockTransport: unbuffered channels). Two
// memberlist nodes on such a transport deadlock when each one's packet
// listener answers a ping of the other at the same time, and every sender
// to a node that was shut down blocks forever. Decoupled drains the inner
// transport continuously into buffers (dropping when full, like UDP),
// and keeps draining after Shutdown until Stop.
type Decoupled struct {
	memberlist.NodeAwareTransport
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	down     atomic.Bool
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Decouple starts draining t. Call Stop when no node uses any transport of
// the network any more.
func Decouple(t memberlist.NodeAwareTransport) *Decoupled {
	d := &Decoupled{
		NodeAwareTransport: t,
		packetCh:           make(chan *memberlist.Packet, 1024),
		streamCh:           make(chan net.Conn, 64),
		stop:               make(chan struct{}),
	}
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		for {
			select {
			case <-d.stop:
				return
			case p := <-t.PacketCh():
				if d.down.Load() {
					continue
				}
				select {
				case d.packetCh <- p:
				default:
				}
			}
		}
	}()
	go func() {
		defer d.wg.Done()
		for {
			select {
			case <-d.stop:
				return
			case c := <-t.StreamCh():
				if d.down.Load() {
					c.Close()
					continue
				}
				select {
				case d.streamCh <- c:
				default:
					c.Close()
				}
			}
		}
	}()
	return d
}

func (d *Decoupled) PacketCh() <-chan *memberlist.Packet { return d.packetCh }
func (d *Decoupled) StreamCh() <-chan net.Conn           { return d.streamCh }

// Shutdown stops delivering to the node; the inner transport is drained on.
func (d *Decoupled) Shutdown() error {
	d.down.Store(true)
	return d.NodeAwareTransport.Shutdown()
}

// Stop ends the draining goroutines.
func (d *Decoupled) Stop() {
	d.stopOnce.Do(func() { close(d.stop) })
	d.wg.Wait()
}
