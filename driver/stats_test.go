package driver

import (
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// A metrics scrape reads the kernel without the network's lock: a slow
// dump holds up no Join and no peer, and the figures are counts.
func TestStatsReadTheKernelWithoutTheLock(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "ep1", 1)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:42:0a:01:00:32", "198.51.100.2")))

	entered, release := make(chan struct{}), make(chan struct{})
	k.SetFault(func(op fakekernel.Op, _ string) error {
		if op == fakekernel.OpFDB {
			close(entered)
			<-release
		}
		return nil
	})
	stats := make(chan []NetworkStats)
	go func() { stats <- d.Stats() }()
	<-entered
	k.SetFault(nil)
	added := make(chan error)
	go func() {
		added <- d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:42:0a:01:00:33", "198.51.100.2"))
	}()
	select {
	case err := <-added:
		must(t, err)
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("AddPeer waited for a metrics scrape's kernel dump")
	}
	close(release)
	s := <-stats
	if len(s) != 1 || s[0].Joined != 1 || s[0].Unjoined != 0 || s[0].Remote != 1 || !s[0].Sandbox || s[0].FDBEntries != 2 {
		t.Fatalf("Stats = %+v, want 1 joined, 1 remote (counted before r2), a sandbox, 2 FDB entries (read after r2)", s)
	}
}
