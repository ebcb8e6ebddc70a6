package testbed

import (
	"testing"
	"time"
)

// TestStream: a stream across the switch loses nothing; one whose
// receiver's link goes down for a while names the numbers lost, and an
// outsider on the switch reaches the hosts.
func TestStream(t *testing.T) {
	requireTestbed(t)
	topo, err := New(t).NewTopology(IPv4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := topo.WaitUnderlay(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	h1, h2 := topo.Hosts[0], topo.Hosts[1]
	s, err := StartStream(h1.NS, h2.NS, h2.Underlay, 7100, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if st := s.Stop(); st.Sent < 20 || st.Received != st.Sent || len(st.Lost) != 0 || st.Duplicates != 0 {
		t.Fatalf("healthy stream: %s", st)
	}

	s, err = StartStream(h1.NS, h2.NS, h2.Underlay, 7100, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := h2.SetLink(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := h2.SetLink(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	st := s.Stop()
	if len(st.Lost) == 0 || st.Received == st.Sent || st.Lost[0].First == 0 || st.Lost[len(st.Lost)-1].Last == st.Sent-1 {
		t.Fatalf("a stream cut in its middle: %s", st)
	}
	t.Logf("cut stream: %s", st)

	out, err := topo.AddOutsider()
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Hosts) != 2 {
		t.Fatalf("the outsider is among the hosts: %d hosts", len(topo.Hosts))
	}
	if err := out.NS.PingUntil(h1.Underlay, 5*time.Second); err != nil {
		t.Fatalf("outsider → h1: %v", err)
	}
}
