package testbed

import (
	"net/netip"
	"testing"
)

// What `ip -s xfrm state list` prints (iproute2 6.1): two SAs of the
// plugin's reqid and one of another.
const xfrmStateOut = `src 198.51.100.1 dst 198.51.100.2
	proto esp spi 0x0000a001(40961) reqid 3676(0x00000e5c) mode transport
	replay-window 0 seq 0x00000000 flag  (0x00000000)
	aead rfc4106(gcm(aes)) 0x00 (160 bits) 128
	anti-replay context: seq 0x0, oseq 0x15, bitmap 0x00000000
	sel src 0.0.0.0/0 dst 0.0.0.0/0 
	lifetime config:
	  limit: soft (INF)(bytes), hard (INF)(bytes)
	  limit: soft (INF)(packets), hard (INF)(packets)
	  expire add: soft 0(sec), hard 0(sec)
	  expire use: soft 0(sec), hard 0(sec)
	lifetime current:
	  2814(bytes), 21(packets)
	  add 2026-12-02 06:00:00 use 2026-12-02 06:00:01
	stats:
	  replay-window 0 replay 0 failed 0
src 198.51.100.2 dst 198.51.100.1
	proto esp spi 0x0000b001(45057) reqid 3676(0x00000e5c) mode transport
	lifetime current:
	  1340(bytes), 10(packets)
src 198.51.100.1 dst 198.51.100.2
	proto esp spi 0x0000c001(49153) reqid 7(0x00000007) mode transport
	lifetime current:
	  99999(bytes), 999(packets)
`

func TestParseXfrmStates(t *testing.T) {
	ks, err := ParseXfrmStates(xfrmStateOut)
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	want := []XfrmState{
		{Src: a, Dst: b, Proto: "esp", SPI: 0xa001, ReqID: 0xe5c, Bytes: 2814, Packets: 21},
		{Src: b, Dst: a, Proto: "esp", SPI: 0xb001, ReqID: 0xe5c, Bytes: 1340, Packets: 10},
		{Src: a, Dst: b, Proto: "esp", SPI: 0xc001, ReqID: 7, Bytes: 99999, Packets: 999},
	}
	if len(ks) != len(want) {
		t.Fatalf("got %d states %+v, want %+v", len(ks), ks, want)
	}
	for i := range want {
		if ks[i] != want[i] {
			t.Errorf("state %d: %+v, want %+v", i, ks[i], want[i])
		}
	}
	// Growth: the plugin's SAs only; one SA grew, one is new.
	before := []XfrmState{{Src: a, Dst: b, Proto: "esp", SPI: 0xa001, ReqID: 0xe5c, Bytes: 814, Packets: 1}}
	if p, by := XfrmGrowth(before, ks, a, b); p != 20 || by != 2000 {
		t.Errorf("growth %s->%s: %d packets, %d bytes; want 20, 2000", a, b, p, by)
	}
	if p, by := XfrmGrowth(before, ks, b, a); p != 10 || by != 1340 {
		t.Errorf("growth %s->%s: %d packets, %d bytes; want 10, 1340 (a new SA counts in full)", b, a, p, by)
	}
}
