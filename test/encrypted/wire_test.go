package encrypted

// Packet-level helpers, all running inside this process on threads switched
// into a namespace (testbed.Netns.Do): a DF ping of a chosen size,
// crafted VXLAN frames sent raw onto the underlay, a UDP sink, and
// sequenced UDP echo streams for counting loss. No tcpdump, ping or
// netcat: under the VM's emulation every process start costs 50-150 ms.
// What crosses a host's underlay link is testbed.StartCapture's.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

var pingID atomic.Uint32

// pingDF sends one ICMP echo request whose IPv4 packet is size bytes long,
// with Don't Fragment set, from ns to dst, and waits up to timeout for the
// matching reply (same id, sequence and payload). A size above the route's
// MTU fails at once with EMSGSIZE.
func pingDF(ns *testbed.Netns, dst netip.Addr, size int, timeout time.Duration) error {
	if !dst.Is4() || size < 28 {
		return fmt.Errorf("pingDF: want an IPv4 destination and size >= 28, got %v, %d", dst, size)
	}
	var conn *net.IPConn
	err := ns.Do(func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		ic := c.(*net.IPConn)
		rc, err := ic.SyscallConn()
		if err == nil {
			var serr error
			err = rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			})
			err = errors.Join(err, serr)
		}
		if err != nil {
			c.Close()
			return err
		}
		conn = ic
		return nil
	})
	if err != nil {
		return fmt.Errorf("DF ping %s from %s: %w", dst, ns.Name, err)
	}
	defer conn.Close()
	n := pingID.Add(1)
	id, seq := uint16(n>>16^0x5a5a), uint16(n)
	msg := make([]byte, size-20)
	msg[0] = 8 // echo request
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], seq)
	_, _ = rand.Read(msg[8:])
	binary.BigEndian.PutUint16(msg[2:], testbed.InetChecksum(msg))
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return fmt.Errorf("DF ping %s (%d bytes) from %s: send: %w", dst, size, ns.Name, err)
	}
	buf := make([]byte, 65536)
	for {
		k, from, err := conn.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("DF ping %s (%d bytes) from %s: no reply within %v: %w", dst, size, ns.Name, timeout, err)
		}
		if ipa, ok := from.(*net.IPAddr); !ok || !ipa.IP.Equal(dst.AsSlice()) {
			continue
		}
		r := buf[:k]
		if len(r) == len(msg) && r[0] == 0 && binary.BigEndian.Uint16(r[4:]) == id &&
			binary.BigEndian.Uint16(r[6:]) == seq && bytes.Equal(r[8:], msg[8:]) {
			return nil
		}
	}
}

// ipv4Header builds a 20-byte IPv4 header with its checksum.
func ipv4Header(src, dst netip.Addr, proto byte, payloadLen int, id uint16) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
	binary.BigEndian.PutUint16(h[4:], id)
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], testbed.InetChecksum(h))
	return h
}

// udpDatagram is an IPv4 UDP header plus payload, checksum 0 (none).
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	return append(u, payload...)
}

// innerFrame describes the frame a crafted VXLAN packet carries: an
// Ethernet frame with an IPv4 UDP datagram.
type innerFrame struct {
	DstMAC, SrcMAC net.HardwareAddr
	Src, Dst       netip.Addr
	SrcPort        uint16
	DstPort        uint16
	Payload        []byte
}

// vxlanPayload is what follows the outer UDP header: the 8-byte VXLAN
// header (flags 0x08: VNI valid) and the inner frame.
func vxlanPayload(vni uint32, in innerFrame) []byte {
	b := make([]byte, 8, 256)
	b[0] = 0x08
	b[4], b[5], b[6] = byte(vni>>16), byte(vni>>8), byte(vni)
	b = append(b, in.DstMAC...)
	b = append(b, in.SrcMAC...)
	b = append(b, 0x08, 0x00)
	u := udpDatagram(in.SrcPort, in.DstPort, in.Payload)
	b = append(b, ipv4Header(in.Src, in.Dst, unix.IPPROTO_UDP, len(u), 0x1234)...)
	return append(b, u...)
}

// outerFrame wraps a UDP payload into Ethernet + IPv4 + UDP, as it would
// appear on the underlay with no IPsec.
func outerFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, 0, 14+20+8+len(payload))
	f = append(f, dstMAC...)
	f = append(f, srcMAC...)
	f = append(f, 0x08, 0x00)
	u := udpDatagram(sport, dport, payload)
	f = append(f, ipv4Header(src, dst, unix.IPPROTO_UDP, len(u), uint16(time.Now().UnixNano()))...)
	return append(f, u...)
}

// sendRaw writes the complete Ethernet frame count times, gap apart, onto
// ifname in ns with an AF_PACKET socket: below IP, so neither nftables nor
// the namespace's xfrm policies see it.
func sendRaw(ns *testbed.Netns, ifname string, frame []byte, count int, gap time.Duration) error {
	var fd, ifindex int
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		ifindex = ifi.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("raw socket on %s in %s: %w", ifname, ns.Name, err)
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6, Protocol: testbed.Htons(0x0800)}
	copy(sa.Addr[:], frame[:6])
	for i := range count {
		if i > 0 {
			time.Sleep(gap)
		}
		if err := unix.Sendto(fd, frame, 0, sa); err != nil {
			return fmt.Errorf("raw send on %s in %s: %w", ifname, ns.Name, err)
		}
	}
	return nil
}

// udpSink counts the datagrams a UDP socket in a namespace receives, by
// payload.
type udpSink struct {
	conn *net.UDPConn
	mu   sync.Mutex
	got  map[string]int
	done chan struct{}
}

func listenUDP(ns *testbed.Netns, addr netip.AddrPort) (*udpSink, error) {
	s := &udpSink{got: map[string]int{}, done: make(chan struct{})}
	err := ns.Do(func() error {
		var err error
		s.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen udp %s in %s: %w", addr, ns.Name, err)
	}
	go func() {
		defer close(s.done)
		buf := make([]byte, 65536)
		for {
			n, err := s.conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got[string(buf[:n])]++
			s.mu.Unlock()
		}
	}()
	return s, nil
}

func (s *udpSink) count(payload []byte) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[string(payload)]
}

func (s *udpSink) Close() {
	s.conn.Close()
	<-s.done
}

// waitCount waits up to timeout for payload to have arrived at least once.
func (s *udpSink) waitCount(payload []byte, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if s.count(payload) > 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stream is a sequenced UDP echo stream between two namespaces: the sender
// sends sequence numbers every interval, the echo side records and returns
// them, the sender records the replies. Every number must arrive exactly
// once in each direction.
type stream struct {
	Name     string
	tx, rx   *net.UDPConn
	interval time.Duration
	tag      [8]byte

	sent   atomic.Uint32
	mu     sync.Mutex
	sentAt []time.Time    // by sequence number
	fwd    map[uint32]int // at the echo side
	back   map[uint32]int // replies at the sender
	errs   []error

	stop    chan struct{}
	senders sync.WaitGroup
	readers sync.WaitGroup
}

// startStream listens on to (inside toNS), dials it from fromNS and starts
// sending.
func startStream(name string, fromNS, toNS *testbed.Netns, to netip.AddrPort, interval time.Duration) (*stream, error) {
	s := &stream{Name: name, interval: interval, fwd: map[uint32]int{}, back: map[uint32]int{}, stop: make(chan struct{})}
	_, _ = rand.Read(s.tag[:])
	if err := toNS.Do(func() error {
		var err error
		s.rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		return nil, fmt.Errorf("stream %s: listen %s in %s: %w", name, to, toNS.Name, err)
	}
	if err := fromNS.Do(func() error {
		var err error
		s.tx, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	}); err != nil {
		s.rx.Close()
		return nil, fmt.Errorf("stream %s: dial %s from %s: %w", name, to, fromNS.Name, err)
	}
	_ = s.rx.SetReadBuffer(1 << 20)
	_ = s.tx.SetReadBuffer(1 << 20)
	s.readers.Add(2)
	go s.echo()
	go s.replies()
	s.senders.Add(1)
	go s.send()
	return s, nil
}

func (s *stream) seqOf(b []byte) (uint32, bool) {
	if len(b) != 12 || !bytes.Equal(b[:8], s.tag[:]) {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[8:]), true
}

func (s *stream) echo() {
	defer s.readers.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := s.rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		seq, ok := s.seqOf(buf[:n])
		if !ok {
			continue
		}
		s.mu.Lock()
		s.fwd[seq]++
		s.mu.Unlock()
		if _, err := s.rx.WriteToUDPAddrPort(buf[:n], from); err != nil {
			s.fail(fmt.Errorf("echo of %d: %w", seq, err))
		}
	}
}

func (s *stream) replies() {
	defer s.readers.Done()
	buf := make([]byte, 2048)
	for {
		n, err := s.tx.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// ECONNREFUSED from an ICMP error would be a lost packet
			// too; record it and carry on.
			s.fail(fmt.Errorf("read reply: %w", err))
			continue
		}
		if seq, ok := s.seqOf(buf[:n]); ok {
			s.mu.Lock()
			s.back[seq]++
			s.mu.Unlock()
		}
	}
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) < 10 {
		s.errs = append(s.errs, err)
	}
}

func (s *stream) send() {
	defer s.senders.Done()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	msg := make([]byte, 12)
	copy(msg, s.tag[:])
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		seq := s.sent.Load()
		binary.BigEndian.PutUint32(msg[8:], seq)
		s.mu.Lock()
		s.sentAt = append(s.sentAt, time.Now())
		s.mu.Unlock()
		if _, err := s.tx.Write(msg); err != nil {
			s.fail(fmt.Errorf("send %d: %w", seq, err))
		}
		s.sent.Add(1) // counted even if the send failed: it is then lost
	}
}

// streamResult is a finished stream's tally.
type streamResult struct {
	Name                 string
	Sent                 uint32
	FwdMissing, FwdDup   []uint32
	BackMissing, BackDup []uint32
	Errs                 []error
	// Gaps are the runs of lost sequence numbers (either direction) with
	// when they were sent.
	Gaps []string
}

func (r streamResult) Lossless() bool {
	return r.Sent > 0 && len(r.FwdMissing)+len(r.FwdDup)+len(r.BackMissing)+len(r.BackDup)+len(r.Errs) == 0
}

func (r streamResult) String() string {
	short := func(s []uint32) string {
		if len(s) > 20 {
			return fmt.Sprintf("%v... (%d)", s[:20], len(s))
		}
		return fmt.Sprint(s)
	}
	return fmt.Sprintf("stream %s: sent %d; forward missing %s dup %s; replies missing %s dup %s; errors %v; lost runs %v",
		r.Name, r.Sent, short(r.FwdMissing), short(r.FwdDup), short(r.BackMissing), short(r.BackDup), r.Errs, r.Gaps)
}

// Stop stops sending, lets in-flight packets land for settle, closes the
// sockets and tallies.
func (s *stream) Stop(settle time.Duration) streamResult {
	close(s.stop)
	s.senders.Wait()
	time.Sleep(settle)
	s.tx.Close()
	s.rx.Close()
	s.readers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := streamResult{Name: s.Name, Sent: s.sent.Load(), Errs: slices.Clone(s.errs)}
	for seq := range r.Sent {
		switch n := s.fwd[seq]; {
		case n == 0:
			r.FwdMissing = append(r.FwdMissing, seq)
		case n > 1:
			r.FwdDup = append(r.FwdDup, seq)
		}
		switch n := s.back[seq]; {
		case n == 0:
			r.BackMissing = append(r.BackMissing, seq)
		case n > 1:
			r.BackDup = append(r.BackDup, seq)
		}
	}
	lost := func(seq uint32) bool { return s.fwd[seq] == 0 || s.back[seq] == 0 }
	for seq := uint32(0); seq < r.Sent; seq++ {
		if !lost(seq) {
			continue
		}
		end := seq
		for end+1 < r.Sent && lost(end+1) {
			end++
		}
		at := func(q uint32) string {
			if int(q) < len(s.sentAt) {
				return s.sentAt[q].Format("15:04:05.000")
			}
			return "?"
		}
		r.Gaps = append(r.Gaps, fmt.Sprintf("%d-%d (%d, sent %s-%s, fwd lost %v)", seq, end, end-seq+1, at(seq), at(end), s.fwd[seq] == 0))
		seq = end
	}
	return r
}

// Progress is how many were sent and echoed so far.
func (s *stream) Progress() (sent, echoed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.sent.Load()), len(s.back)
}

// sendUDP sends count small datagrams from the namespace to dst, which
// need not listen (an unconnected socket ignores the ICMP errors back).
func sendUDP(ns *testbed.Netns, dst netip.AddrPort, count int) error {
	var conn *net.UDPConn
	if err := ns.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp", nil)
		return err
	}); err != nil {
		return fmt.Errorf("udp socket in %s: %w", ns.Name, err)
	}
	defer conn.Close()
	to := net.UDPAddrFromAddrPort(dst)
	for i := range count {
		if _, err := conn.WriteToUDP([]byte("numbering on"), to); err != nil {
			return fmt.Errorf("send %d of %d to %s from %s: %w", i+1, count, dst, ns.Name, err)
		}
		if i%50 == 49 {
			time.Sleep(10 * time.Millisecond) // not faster than the queues
		}
	}
	return nil
}
