package testbed

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// frame is an Ethernet frame with an IPv4 header (proto, fragment field)
// and payload after it.
func frame(src, dst netip.Addr, proto byte, fragField uint16, payload []byte) []byte {
	f := make([]byte, 14+20, 14+20+len(payload))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], fragField)
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	return append(f, payload...)
}

func TestClassify(t *testing.T) {
	a, b := netip.MustParseAddr("198.51.100.11"), netip.MustParseAddr("198.51.100.12")
	st := CaptureStats{ESP: map[AddrPair]int{}, VXLAN: map[uint32]int{}, VXLANFlows: map[VXLANFlow]int{}}
	vxlan := make([]byte, 8+8+14)
	binary.BigEndian.PutUint16(vxlan[2:], 4789)
	vxlan[8] = 0x08
	vxlan[8+4], vxlan[8+5], vxlan[8+6] = 0, 0x01, 0x02 // VNI 258
	st.classify(frame(a, b, 17, 0, vxlan), 4789)
	st.classify(frame(a, b, 17, 0, vxlan), 4790)            // another port: not VXLAN
	st.classify(frame(b, a, 50, 0, make([]byte, 60)), 4789) // ESP
	st.classify(frame(b, a, 50, 0x2000, make([]byte, 8)), 4789)
	st.classify([]byte{1, 2, 3}, 4789) // too short: ignored

	if st.Total != 4 || st.Fragments != 1 {
		t.Errorf("total %d fragments %d, want 4 and 1", st.Total, st.Fragments)
	}
	if st.VXLAN[258] != 1 || st.VXLANFlows[VXLANFlow{AddrPair{Src: a, Dst: b}, 258}] != 1 {
		t.Errorf("VXLAN %v flows %v, want one of VNI 258 from %v to %v", st.VXLAN, st.VXLANFlows, a, b)
	}
	if st.ESP[AddrPair{Src: b, Dst: a}] != 2 || st.ESPMaxLen != 80 {
		t.Errorf("ESP %v largest %d, want 2 from %v to %v, largest 80", st.ESP, st.ESPMaxLen, b, a)
	}
}
