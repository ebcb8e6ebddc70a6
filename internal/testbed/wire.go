package testbed

// The wire classifier: what crosses one underlay link, counted by kind
// (ESP between which hosts, VXLAN in clear by VNI), read with an AF_PACKET
// socket on a thread switched into the link's namespace. No tcpdump: under
// the VM's emulation every process start costs 50-150 ms, and its text
// output would need parsing again. test/encrypted and test/dockere2e share it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Htons is v in network byte order, as AF_PACKET's protocol fields want it.
func Htons(v uint16) uint16 { return v<<8 | v>>8 }

// AddrPair is a (source, destination) of IPv4 packets.
type AddrPair struct{ Src, Dst netip.Addr }

func (p AddrPair) String() string { return p.Src.String() + "->" + p.Dst.String() }

// VXLANFlow is plaintext VXLAN of one VNI between two hosts.
type VXLANFlow struct {
	AddrPair
	VNI uint32
}

// CaptureStats classifies the IPv4 packets a capture saw.
type CaptureStats struct {
	ESP map[AddrPair]int
	// ESPMaxLen is the largest IPv4 total length of an ESP packet.
	ESPMaxLen int
	// VXLAN counts plaintext VXLAN (UDP to the capture's port) by VNI,
	// VXLANFlows by VNI and direction.
	VXLAN      map[uint32]int
	VXLANFlows map[VXLANFlow]int
	// Fragments counts IPv4 fragments of any protocol.
	Fragments int
	Total     int
}

// Capture records what crosses one interface, both directions, with an
// AF_PACKET socket.
type Capture struct {
	fd      int
	ifindex int
	port    uint16
	stop    atomic.Bool
	done    chan struct{}
	closeFD sync.Once
	// mu guards st and err, written by the capture's goroutine and read by
	// Stop. A leaf: nothing else is locked while it is held (test code,
	// outside the plugin's order in internal/lockrank).
	mu  sync.Mutex
	st  CaptureStats
	err error
}

// StartCapture opens the capture on ifname inside ns; VXLAN is recognised
// by UDP destination port vxlanPort.
func StartCapture(ns *Netns, ifname string, vxlanPort uint16) (*Capture, error) {
	return startCapture(ns, ifname, vxlanPort, false)
}

// StartBridgeCapture is StartCapture on a bridge, in promiscuous mode (as
// tcpdump does): a bridge passes up a copy of the frames it forwards
// between its ports only then.
func StartBridgeCapture(ns *Netns, bridge string, vxlanPort uint16) (*Capture, error) {
	return startCapture(ns, bridge, vxlanPort, true)
}

func startCapture(ns *Netns, ifname string, vxlanPort uint16, promisc bool) (*Capture, error) {
	c := &Capture{fd: -1, port: vxlanPort, done: make(chan struct{}), st: CaptureStats{
		ESP: map[AddrPair]int{}, VXLAN: map[uint32]int{}, VXLANFlows: map[VXLANFlow]int{}}}
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(Htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: Htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		if promisc {
			// Dropped with the socket: nothing to undo.
			mr := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_PROMISC}
			if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
				unix.Close(fd)
				return err
			}
		}
		tv := unix.Timeval{Usec: 100_000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		c.fd, c.ifindex = fd, ifi.Index
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture on %s in %s: %w", ifname, ns.Name, err)
	}
	go c.loop()
	return c, nil
}

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		// Once stopping, drain what is queued without waiting: a packet
		// the test already saw arrive is in the queue by then (outgoing
		// copies are queued at transmit time).
		stopping := c.stop.Load()
		flags := 0
		if stopping {
			flags = unix.MSG_DONTWAIT
		}
		n, from, err := unix.Recvfrom(c.fd, buf, flags)
		if err != nil {
			if errors.Is(err, unix.EINTR) || (errors.Is(err, unix.EAGAIN) && !stopping) {
				continue
			}
			if errors.Is(err, unix.EAGAIN) {
				return // drained
			}
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		// Packets that raced the bind may come from another interface.
		if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Ifindex != c.ifindex {
			continue
		}
		c.mu.Lock()
		c.st.classify(buf[:n], c.port)
		c.mu.Unlock()
	}
}

// classify counts one Ethernet frame; VXLAN is UDP to vxlanPort.
func (st *CaptureStats) classify(f []byte, vxlanPort uint16) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ihl < 20 || len(ip) < ihl {
		return
	}
	src, _ := netip.AddrFromSlice(ip[12:16])
	dst, _ := netip.AddrFromSlice(ip[16:20])
	frag := binary.BigEndian.Uint16(ip[6:])
	st.Total++
	if frag&0x3fff != 0 { // MF or an offset
		st.Fragments++
	}
	switch ip[9] {
	case unix.IPPROTO_ESP:
		st.ESP[AddrPair{Src: src, Dst: dst}]++
		st.ESPMaxLen = max(st.ESPMaxLen, total)
	case unix.IPPROTO_UDP:
		u := ip[ihl:]
		if frag&0x1fff == 0 && len(u) >= 8+8 && binary.BigEndian.Uint16(u[2:]) == vxlanPort {
			vni := uint32(u[12])<<16 | uint32(u[13])<<8 | uint32(u[14])
			st.VXLAN[vni]++
			st.VXLANFlows[VXLANFlow{AddrPair{Src: src, Dst: dst}, vni}]++
		}
	}
}

// Stop ends the capture and returns what it saw; again if called again
// (a deferred Stop after the test's own is harmless).
func (c *Capture) Stop() (CaptureStats, error) {
	c.stop.Store(true)
	<-c.done
	c.closeFD.Do(func() { unix.Close(c.fd) })
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st, c.err
}
