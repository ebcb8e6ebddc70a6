package memnet

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"
)

// Latency is virtual time in a bubble: a packet arrives exactly one
// latency later, a dial returns after a round trip.
func TestLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := New()
		n.SetLatency(100 * time.Microsecond)
		a, _ := n.NewTransport(netip.MustParseAddrPort("192.0.2.1:7947"))
		b, _ := n.NewTransport(netip.MustParseAddrPort("192.0.2.2:7947"))
		defer a.Shutdown()
		defer b.Shutdown()

		start := time.Now()
		if _, err := a.WriteToAddress([]byte("ping"), memberlist.Address{Addr: "192.0.2.2:7947"}); err != nil {
			t.Fatal(err)
		}
		p := <-b.PacketCh()
		if got := time.Since(start); got != 100*time.Microsecond || string(p.Buf) != "ping" {
			t.Errorf("packet %q after %v, want \"ping\" after 100µs", p.Buf, got)
		}

		start = time.Now()
		go func() { (<-b.StreamCh()).Close() }()
		c, err := a.DialAddressTimeout(memberlist.Address{Addr: "192.0.2.2:7947"}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if got := time.Since(start); got != 200*time.Microsecond {
			t.Errorf("dial took %v, want 200µs", got)
		}
	})
}

// A dial the filter blocks fails at once, or with SetHang after its
// timeout, as into a partition that drops packets.
func TestHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := New()
		a, _ := n.NewTransport(netip.MustParseAddrPort("192.0.2.1:7947"))
		b, _ := n.NewTransport(netip.MustParseAddrPort("192.0.2.2:7947"))
		defer a.Shutdown()
		defer b.Shutdown()
		n.SetFilter(func(_, _ netip.AddrPort, _ bool) bool { return false })
		for _, hang := range []bool{false, true} {
			n.SetHang(hang)
			start := time.Now()
			if _, err := a.DialAddressTimeout(memberlist.Address{Addr: "192.0.2.2:7947"}, time.Second); err == nil {
				t.Fatalf("hang %v: a filtered dial succeeded", hang)
			}
			want := map[bool]time.Duration{false: 0, true: time.Second}[hang]
			if got := time.Since(start); got != want {
				t.Errorf("hang %v: the dial failed after %v, want %v", hang, got, want)
			}
		}
	})
}
