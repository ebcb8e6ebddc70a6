package encrypted

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// phaseRestart stops h1's plugin and starts it again, as `docker plugin
// disable`/`enable` does, while sequenced streams run through it (c1->c2,
// c3->c1). Its sandboxes are held as a managed plugin's host mount holds
// them. The new run takes the previous one's IPsec state over, so no
// packet is lost, none crosses the underlay in clear, and once h1's
// inherited generation has retired (Lead+Grace after the start) none of
// the previous run's SAs is left.
func (s *suite) phaseRestart(t *testing.T) {
	h1, h2 := s.Nodes[0], s.Nodes[1]
	pre := s.quietSchedule(t, lead+grace+20*time.Second)
	previous := map[uint32]bool{}
	for _, st := range pre[h1].States {
		previous[st.SPI] = true
	}
	if err := h1.Plugin.HoldSandboxes(); err != nil {
		t.Fatal(err)
	}
	capt, err := testbed.StartCapture(h2.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()
	stopAll := s.startStreams(t)
	defer stopAll()

	// The worst case for the handover: h1's peers reach its new run only
	// after Lead (they re-join a node that left every 10 s), when a
	// generation the new run made at start would already be active.
	uncut, err := cutGossip(h1.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer uncut()
	down := time.Now()
	if err := h1.Plugin.Stop(0); err != nil {
		t.Fatalf("stop h1's plugin: %v", err)
	}
	time.Sleep(time.Second)
	if err := s.Restart(h1); err != nil {
		t.Fatalf("start h1's plugin again: %v", err)
	}
	p := h1.Plugin
	t.Logf("h1's plugin stopped and ready again (pid %d) in %v", p.Pid(), time.Since(down).Round(time.Millisecond))
	time.Sleep(lead + 2*time.Second)
	if err := uncut(); err != nil {
		t.Fatal(err)
	}
	t.Logf("h1 cut off from gossip for %v across the restart", time.Since(down).Round(time.Millisecond))
	// Ready means the driver serves; the control plane, and with it the
	// encryption side, starts just after.
	if err := wait.Until(20*time.Second, poll, func() error {
		if log := p.LogTail(200); !strings.Contains(log, "took over the previous run's IPsec state") || !strings.Contains(log, "adopted encrypted sandbox guarded again") {
			return errors.New("not in its log yet")
		}
		return nil
	}); err != nil {
		t.Errorf("h1's new run takes the encrypted network over: %v; log tail:\n%s", err, p.LogTail(60))
	}
	err = wait.Until(lead+grace+60*time.Second, poll, func() error {
		st, err := h1.Plugin.EncryptionStatus()
		if err != nil {
			return err
		}
		if len(st.Own) != 1 || st.Own[0].Gen == pre[h1].Own[0].Gen {
			return fmt.Errorf("own generations %+v", st.Own)
		}
		for _, sa := range st.States {
			if previous[sa.SPI] {
				return fmt.Errorf("SA %#x of the previous run still installed", sa.SPI)
			}
		}
		for _, o := range s.Others(h1) {
			if r := testbed.RemoteOf(st, o.Underlay); r == nil || r.Blocked || r.PolicySPI == 0 || previous[r.PolicySPI] {
				return fmt.Errorf("towards %s: %+v", o.Name, r)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("h1 back to one generation, none of the previous run's SAs left: %v", err)
	}
	t.Logf("h1 on its own keys only %v after the stop", time.Since(down).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	for _, r := range stopAll() {
		t.Logf("%s", r)
		if !r.Lossless() {
			t.Errorf("packets lost or duplicated across the plugin restart: %s", r)
		}
	}
	cs, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capture on h2 during the restart: VXLAN by VNI %v, ESP %v", cs.VXLAN, cs.ESP)
	if n := cs.VXLAN[s.enc.VNI]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d crossed the underlay", n, s.enc.VNI)
	}
}
