package espvm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// The traffic of one measurement, in the containers' namespaces: a sink
// that counts what a sender sends for a fixed time (throughput), and
// small request/response exchanges with testbed's echo server (round
// trip). The probes run in this process on threads switched into the
// namespaces (testbed.Netns.Listen/Dial), as testbed's own probes do.

const (
	chunk   = 128 << 10 // bytes per write and per read
	rttSize = 64        // bytes per request (and its reply)
	// ioSlack bounds every socket operation beyond the measurement's own
	// duration: a stalled path fails the run instead of hanging it.
	ioSlack = 60 * time.Second
)

// sink is a TCP server that reads each connection to its end and answers
// with the number of bytes it read (8 bytes, big-endian): the sender's
// correctness check.
type sink struct {
	l    net.Listener
	idle time.Duration
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func startSink(ns *testbed.Netns, addr netip.AddrPort, idle time.Duration) (*sink, error) {
	l, err := ns.Listen(addr)
	if err != nil {
		return nil, err
	}
	s := &sink{l: l, idle: idle}
	s.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.serve(c) })
		}
	})
	return s, nil
}

func (s *sink) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(s.idle))
	buf := make([]byte, chunk)
	var n uint64
	var err error
	for {
		var k int
		k, err = c.Read(buf)
		n += uint64(k)
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = binary.Write(c, binary.BigEndian, n)
	}
	if err != nil {
		s.mu.Lock()
		s.errs = append(s.errs, err)
		s.mu.Unlock()
	}
}

// Close stops the sink and waits for its connections; it returns the
// errors they met.
func (s *sink) Close() error {
	_ = s.l.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// throughput is one measurement's result over its streams.
type throughput struct {
	Sent, Received uint64
	Seconds        float64
}

// measureThroughput opens streams connections from ns to the sink at
// addr, then sends on all of them at once for d, half-closes each and
// reads back how many bytes the sink received. The time runs from the
// first byte to the last stream's answer. Every stream must have
// delivered exactly what it sent.
func measureThroughput(ns *testbed.Netns, addr netip.AddrPort, streams int, d time.Duration) (throughput, error) {
	var res throughput
	conns := make([]*net.TCPConn, 0, streams)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range streams {
		c, err := ns.Dial(addr, ioSlack)
		if err != nil {
			return res, err
		}
		conns = append(conns, c.(*net.TCPConn))
	}
	data := make([]byte, chunk)
	_, _ = rand.Read(data)
	type out struct {
		sent, got uint64
		err       error
	}
	outs := make([]out, streams)
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			o := &outs[i]
			_ = c.SetDeadline(stop.Add(ioSlack))
			for time.Now().Before(stop) {
				k, err := c.Write(data)
				o.sent += uint64(k)
				if err != nil {
					o.err = fmt.Errorf("stream %d: send: %w", i+1, err)
					return
				}
			}
			if err := c.CloseWrite(); err != nil {
				o.err = fmt.Errorf("stream %d: half-close: %w", i+1, err)
				return
			}
			if err := binary.Read(c, binary.BigEndian, &o.got); err != nil {
				o.err = fmt.Errorf("stream %d: the sink's count: %w", i+1, err)
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	var errs []error
	for i, o := range outs {
		res.Sent += o.sent
		res.Received += o.got
		if o.err == nil && o.got != o.sent {
			o.err = fmt.Errorf("stream %d: the sink received %d bytes, %d were sent", i+1, o.got, o.sent)
		}
		if o.err != nil {
			errs = append(errs, o.err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("tcp %s -> %s, %d streams: %w", ns.Name, addr, streams, err)
	}
	return res, nil
}

// roundTrips is one latency measurement: every exchange's round trip.
type roundTrips struct {
	Exchanges, Replies int
	RTT                []time.Duration
}

// measureRoundTrips sends rttSize-byte requests, one at a time, over one
// connection from ns to the echo server at addr, for d (at least
// minExchanges), and times each until its reply is read back. Every reply
// must be the request's bytes.
func measureRoundTrips(ns *testbed.Netns, addr netip.AddrPort, d time.Duration, minExchanges int) (roundTrips, error) {
	var res roundTrips
	c, err := ns.Dial(addr, ioSlack)
	if err != nil {
		return res, err
	}
	defer c.Close()
	req := make([]byte, rttSize)
	_, _ = rand.Read(req)
	reply := make([]byte, rttSize)
	stop := time.Now().Add(d)
	for i := 0; time.Now().Before(stop) || i < minExchanges; i++ {
		binary.BigEndian.PutUint64(req, uint64(i)) // no two requests alike
		t0 := time.Now()
		_ = c.SetDeadline(t0.Add(ioSlack))
		res.Exchanges++
		if _, err := c.Write(req); err != nil {
			return res, fmt.Errorf("tcp %s -> %s: request %d: %w", ns.Name, addr, i+1, err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			return res, fmt.Errorf("tcp %s -> %s: reply %d: %w", ns.Name, addr, i+1, err)
		}
		rtt := time.Since(t0)
		if !slices.Equal(reply, req) {
			return res, fmt.Errorf("tcp %s -> %s: reply %d differs from its request", ns.Name, addr, i+1)
		}
		res.Replies++
		res.RTT = append(res.RTT, rtt)
	}
	return res, nil
}

// quantile is the q-quantile (nearest rank) of ds, in microseconds.
func quantile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i]) / float64(time.Microsecond)
}
