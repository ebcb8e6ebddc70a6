package testbed

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// ListenUDP opens a UDP socket on addr in the namespace; it stays there
// whichever goroutine uses it.
func (n *Netns) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on UDP %s in %s: %w", addr, n.Name, err)
	}
	return c, nil
}

// DialUDP opens a UDP socket in the namespace sending to addr.
func (n *Netns) DialUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() (err error) {
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("UDP to %s from %s: %w", addr, n.Name, err)
	}
	return c, nil
}

// Stream is a numbered UDP stream from one namespace to another: proof
// that no packet was lost while something happened.
type Stream struct {
	send, recv *net.UDPConn
	stop       chan struct{}
	sending    sync.WaitGroup
	receiving  sync.WaitGroup

	// mu guards the figures; a leaf.
	mu   sync.Mutex
	sent uint64
	got  map[uint64]int // sequence number → times received
}

// StreamStats are a stream's figures.
type StreamStats struct {
	Sent, Received, Duplicates uint64
	// Lost are the sequence numbers never received, as ranges.
	Lost []Range
}

// Range is the sequence numbers First..Last.
type Range struct{ First, Last uint64 }

func (st StreamStats) String() string {
	s := fmt.Sprintf("sent %d, received %d", st.Sent, st.Received)
	if st.Duplicates > 0 {
		s += fmt.Sprintf(" (%d duplicates)", st.Duplicates)
	}
	if len(st.Lost) == 0 {
		return s + ", lost 0"
	}
	var lost uint64
	for _, r := range st.Lost {
		lost += r.Last - r.First + 1
	}
	return s + fmt.Sprintf(", lost %d: %v", lost, st.Lost)
}

// streamMagic marks the stream's datagrams, so that nothing else sent to
// the port counts.
const streamMagic = 0x6f76_7374 // "ovst"

// StartStream sends numbered datagrams from src to dstAddr:port, an
// address of dst, every interval, and receives them in dst.
func StartStream(src, dst *Netns, dstAddr netip.Addr, port uint16, interval time.Duration) (*Stream, error) {
	to := netip.AddrPortFrom(dstAddr, port)
	recv, err := dst.ListenUDP(to)
	if err != nil {
		return nil, err
	}
	send, err := src.DialUDP(to)
	if err != nil {
		recv.Close()
		return nil, err
	}
	s := &Stream{send: send, recv: recv, stop: make(chan struct{}), got: map[uint64]int{}}
	s.receiving.Go(s.receive)
	s.sending.Go(func() { s.transmit(interval) })
	return s, nil
}

func (s *Stream) transmit(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	msg := make([]byte, 12)
	binary.BigEndian.PutUint32(msg, streamMagic)
	for seq := uint64(0); ; seq++ {
		binary.BigEndian.PutUint64(msg[4:], seq)
		// A send error (no route while a link is down) is a loss the
		// receiver sees; the number is spent either way.
		_, _ = s.send.Write(msg)
		s.mu.Lock()
		s.sent = seq + 1
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

func (s *Stream) receive() {
	buf := make([]byte, 64)
	for {
		n, err := s.recv.Read(buf)
		if err != nil {
			return // closed by Stop
		}
		if n != 12 || binary.BigEndian.Uint32(buf) != streamMagic {
			continue
		}
		seq := binary.BigEndian.Uint64(buf[4:])
		s.mu.Lock()
		s.got[seq]++
		s.mu.Unlock()
	}
}

// streamDrain bounds the wait for the datagrams still in flight at Stop.
const streamDrain = time.Second

// Stop stops sending, waits up to streamDrain for the datagrams in flight,
// stops receiving and returns the figures.
func (s *Stream) Stop() StreamStats {
	close(s.stop)
	s.sending.Wait()
	deadline := time.Now().Add(streamDrain)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		done := uint64(len(s.got)) >= s.sent
		s.mu.Unlock()
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.recv.Close()
	s.send.Close()
	s.receiving.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := StreamStats{Sent: s.sent}
	var lost []uint64
	for seq := range s.sent {
		switch n := s.got[seq]; {
		case n == 0:
			lost = append(lost, seq)
		default:
			st.Received++
			st.Duplicates += uint64(n - 1)
		}
	}
	slices.Sort(lost)
	for _, seq := range lost {
		if k := len(st.Lost); k > 0 && st.Lost[k-1].Last+1 == seq {
			st.Lost[k-1].Last = seq
		} else {
			st.Lost = append(st.Lost, Range{seq, seq})
		}
	}
	return st
}
