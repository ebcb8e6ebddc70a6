package testbed

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"time"
)

// InnerFrame is the Ethernet frame a forged VXLAN packet carries: IPv4 and
// UDP to a container.
type InnerFrame struct {
	DstMAC, SrcMAC net.HardwareAddr // SrcMAC nil: a made-up local one
	DstIP, SrcIP   netip.Addr
	DstPort        uint16
	Payload        []byte
}

// vxlanPacket is the UDP payload of a VXLAN packet (RFC 7348) of vni
// carrying f.
func (f InnerFrame) vxlanPacket(vni uint32) ([]byte, error) {
	if !f.DstIP.Is4() || !f.SrcIP.Is4() || len(f.DstMAC) != 6 {
		return nil, errors.New("testbed: an inner frame needs IPv4 addresses and a destination MAC")
	}
	src := f.SrcMAC
	if src == nil {
		src = net.HardwareAddr{0x02, 0xba, 0xd0, 0, 0, 1}
	}
	b := make([]byte, 0, 8+14+20+8+len(f.Payload))
	b = append(b, 0x08, 0, 0, 0, byte(vni>>16), byte(vni>>8), byte(vni), 0) // flags: VNI valid
	b = append(b, f.DstMAC...)
	b = append(b, src...)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	ip := len(b)
	b = append(b, 0x45, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(20+8+len(f.Payload)))
	b = append(b, 0, 0, 0x40, 0, 64, 17, 0, 0) // id, DF, TTL, UDP, checksum
	b = append(b, f.SrcIP.AsSlice()...)
	b = append(b, f.DstIP.AsSlice()...)
	binary.BigEndian.PutUint16(b[ip+10:], InetChecksum(b[ip:ip+20]))
	b = binary.BigEndian.AppendUint16(b, 40000)
	b = binary.BigEndian.AppendUint16(b, f.DstPort)
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(f.Payload)))
	b = append(b, 0, 0) // no UDP checksum: allowed over IPv4
	return append(b, f.Payload...), nil
}

// SendVXLAN sends count forged VXLAN packets of vni carrying inner from
// the namespace to dst (a host's underlay address and VXLAN port), one
// every interval, as anyone on the underlay can; it returns how many
// left.
func (n *Netns) SendVXLAN(dst netip.AddrPort, vni uint32, inner InnerFrame, count int, interval time.Duration) (int, error) {
	pkt, err := inner.vxlanPacket(vni)
	if err != nil {
		return 0, err
	}
	c, err := n.DialUDP(dst)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	sent := 0
	for i := range count {
		if i > 0 {
			time.Sleep(interval)
		}
		if _, err := c.Write(pkt); err != nil {
			return sent, err
		}
		sent++
	}
	return sent, nil
}
