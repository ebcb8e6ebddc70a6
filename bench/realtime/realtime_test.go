package realtime

import (
	"testing"
	"time"
)

// TestSmall runs the scenario at a tiny size against every system and
// checks correctness only: every host ends with exactly the other hosts'
// endpoints. Ports differ from the full benchmark's, so the two can
// coexist.
func TestSmall(t *testing.T) {
	p := Params{Hosts: 5, Endpoints: 50, Waves: 5, WaveInterval: 200 * time.Millisecond,
		Timeout: 60 * time.Second, Seeds: 3, PortA: 27947, PortB: 27946}
	rep, err := Run(Options{Params: p, Reps: 1, Progress: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != len(Systems) {
		t.Fatalf("%d runs, want %d", len(rep.Runs), len(Systems))
	}
	for _, r := range rep.Runs {
		if !r.Correct || r.EndpointsConverged != p.Endpoints || r.PairsSeen != r.PairsWanted {
			t.Errorf("%s: converged %v, correct %v, %d/%d endpoints, errors %v", r.System, r.Converged, r.Correct, r.EndpointsConverged, p.Endpoints, r.Errors)
		}
		if r.System != "networkdb" && (r.Records == nil || r.Records.Accepted < uint64(r.PairsWanted)) {
			t.Errorf("%s: record counters %+v, want at least %d accepted", r.System, r.Records, r.PairsWanted)
		}
		if r.Goroutines > 0 {
			t.Errorf("%s: %d goroutines left after close", r.System, r.Goroutines)
		}
	}
	if md := rep.Markdown("x.png"); len(md) == 0 {
		t.Error("empty Markdown")
	}
	if err := rep.Write(t.TempDir(), "small"); err != nil {
		t.Error(err)
	}
}
