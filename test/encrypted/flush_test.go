package encrypted

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
	"github.com/vishvananda/netlink"
)

// phaseOutsideFlush flushes h1's xfrm state and policies from outside
// (as `ip xfrm state flush` would) again and again for two seconds while
// sending VXLAN of the encrypted VNI from h1's host namespace right after
// each flush: the firewall's guard must drop it (the socket sees EPERM and
// the guard's counter grows) unless the plugin has already put a policy
// back, a capture on h2 must see none of it in clear, and the plugin must
// then program everything again.
func (s *suite) phaseOutsideFlush(t *testing.T) {
	h1, h2 := s.Nodes[0], s.Nodes[1]
	c1, c2 := s.ep("c1"), s.ep("c2")
	guard0, err := nftCounter(h1.NS, "guard")
	if err != nil {
		t.Fatal(err)
	}
	before := s.mustStatus(t, h1).Firewall
	capt, err := testbed.StartCapture(h2.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()
	conn := vxlanConn(t, h1, h2)
	frame := vxlanPayload(s.enc.VNI, innerFrame{DstMAC: net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 2},
		SrcMAC: net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 1}, Src: testbed.Nth(s.enc.Pool4, 100),
		Dst: c2.addr(testbed.IPv4), SrcPort: 5555, DstPort: sinkPort, Payload: []byte("must not leave in clear")})
	flushes, refused := 0, 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); flushes++ {
		// By netlink from the test, as `ip xfrm policy flush; ip xfrm
		// state flush` do, and the send right after: two `ip` processes
		// take long enough under emulation for the plugin to have put
		// everything back before the send, which then proves nothing.
		err := h1.NS.Do(func() error {
			if err := netlink.XfrmPolicyFlush(); err != nil {
				return fmt.Errorf("flush policies: %w", err)
			}
			if err := netlink.XfrmStateFlush(0); err != nil {
				return fmt.Errorf("flush states: %w", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// EPERM: the guard dropped it, or the blocking policy the plugin
		// put back. EREMOTE: xfrm found the policy's SA missing.
		if _, err := conn.Write(frame); errors.Is(err, syscall.EPERM) {
			refused++
		} else if err != nil && !errors.Is(err, syscall.EREMOTE) {
			t.Fatalf("send after the flush: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Give a packet that did leave time to cross the underlay.
	time.Sleep(500 * time.Millisecond)
	cs, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	guard1, err := nftCounter(h1.NS, "guard")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h1: %d flushes, %d sends refused, nft guard drops +%d; capture on h2: VXLAN by VNI %v, ESP %v",
		flushes, refused, guard1-guard0, cs.VXLAN, cs.ESP)
	if n := cs.VXLAN[s.enc.VNI]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d left h1 after its xfrm state was flushed", n, s.enc.VNI)
	}
	if refused == 0 || guard1 == guard0 {
		t.Errorf("h1: %d of %d sends refused, guard counter +%d: the guard did not take the traffic the flush left unprotected", refused, flushes, guard1-guard0)
	}
	// Operators see it too: the admin API (and the metrics) report it.
	if after := s.mustStatus(t, h1).Firewall; after.UnprotectedDropped < before.UnprotectedDropped+(guard1-guard0) {
		t.Errorf("h1's encryption status: unprotected drops %d -> %d, want +%d", before.UnprotectedDropped, after.UnprotectedDropped, guard1-guard0)
	}
	// Nothing leaves h1 in clear (the guard), so answered pings mean that
	// the plugin has programmed SAs and policies again, towards each host
	// (the later phases start from there).
	start := time.Now()
	for _, to := range []*endpoint{c2, s.ep("c3")} {
		err = wait.Until(30*time.Second, poll, func() error {
			return c1.Ctr.Ping(to.addr(testbed.IPv4), 2*time.Second)
		})
		t.Logf("c1 reached %s again %v after the last flush", to.name, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("h1 programs its SAs and policies again and c1 reaches %s: %v", to.name, err)
		}
	}
}
