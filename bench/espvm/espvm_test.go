package espvm

import (
	"math"
	"strings"
	"testing"
)

// The report from a guest's raw runs: ratios paired within a repetition,
// a run that is not correct left out of the figures and failing the
// report.
func TestFill(t *testing.T) {
	var raw Raw
	raw.Kernel, raw.MTU = "6.1.0-test", map[string]int{plainNet: 1450, encNet: 1413}
	for rep := range 3 {
		f := float64(rep + 1)
		raw.Runs = append(raw.Runs,
			Run{Rep: rep, Figure: "tcp1", Network: plainNet, Streams: 1, Mbps: 100 * f, Correct: true},
			Run{Rep: rep, Figure: "tcp1", Network: encNet, Streams: 1, Mbps: 50 * f, Correct: true},
			Run{Rep: rep, Figure: "rtt", Network: plainNet, P50Us: 100, P99Us: 200 * f, Correct: true},
			Run{Rep: rep, Figure: "rtt", Network: encNet, P50Us: 150 * f, P99Us: 400 * f, Correct: rep != 2, Error: "x"})
	}
	r := &Report{Reps: 3}
	r.fill(raw, []int{1})
	if r.Correct || r.Err() == nil || !strings.Contains(r.Err().Error(), "rep 3 rtt encrypted: x") {
		t.Errorf("a run not correct: Correct %v, Err %v", r.Correct, r.Err())
	}
	if len(r.Rows) != 3 {
		t.Fatalf("rows %+v, want tcp1, rtt p50, rtt p99", r.Rows)
	}
	tp, p50 := r.Rows[0], r.Rows[1]
	if tp.Ratio.N != 3 || tp.Ratio.Min != 0.5 || tp.Ratio.Max != 0.5 || tp.Plain.Median != 200 || tp.Better != "higher" {
		t.Errorf("throughput row %+v", tp)
	}
	if p50.Ratio.N != 2 || math.Abs(p50.Ratio.Min-1.5) > 1e-9 || math.Abs(p50.Ratio.Max-3) > 1e-9 || p50.Better != "lower" {
		t.Errorf("round-trip row %+v: want the two correct pairs, 1.5 and 3", p50)
	}
	md := r.Markdown()
	for _, want := range []string{"| TCP throughput, 1 stream, Mbit/s (higher is faster) | 100.0 / 200.0 / 300.0 | 50.0 / 100.0 / 150.0 | 0.50 / 0.50 / 0.50 |", "MTU 1413", "not correct: rep 3 rtt encrypted"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if _, err := r.Plot(); err != nil {
		t.Error(err)
	}
}

func TestESPCheck(t *testing.T) {
	for _, c := range []struct {
		r    Run
		fail bool
	}{
		{Run{Network: encNet, Streams: 1, SentBytes: 1000, ESPOut: Growth{Bytes: 1100}}, false},
		{Run{Network: encNet, Streams: 1, SentBytes: 1000, ESPOut: Growth{Bytes: 10}}, true},
		{Run{Network: plainNet, Streams: 1, SentBytes: 1000, ESPOut: Growth{Bytes: 0}}, false},
		{Run{Network: plainNet, Streams: 1, SentBytes: 1000, ESPOut: Growth{Bytes: 1100}}, true},
		{Run{Network: encNet, Exchanges: 10, ESPOut: Growth{Packets: 10}, ESPIn: Growth{Packets: 12}}, false},
		{Run{Network: encNet, Exchanges: 10, ESPOut: Growth{Packets: 10}, ESPIn: Growth{Packets: 2}}, true},
		{Run{Network: plainNet, Exchanges: 10, ESPOut: Growth{Packets: 1}}, false},
		{Run{Network: plainNet, Exchanges: 10, ESPIn: Growth{Packets: 10}}, true},
	} {
		if err := espCheck(c.r); (err != nil) != c.fail {
			t.Errorf("espCheck(%+v) = %v, want failure %v", c.r, err, c.fail)
		}
	}
}
