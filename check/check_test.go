package check

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/health"
)

func TestBuild(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	peer := netip.MustParseAddr("198.51.100.2")
	up := health.PathStatus{Peer: peer, Path: health.PathVXLAN, State: health.StateUp}
	down := health.PathStatus{Peer: peer, Path: health.PathVXLAN, State: health.StateDown, Since: now, Problem: "VXLAN to 198.51.100.2 on UDP 4789 gets no answer"}
	healthy := Inputs{Now: now, Probing: true, Paths: []health.PathStatus{up}, Gossip: true, SecretConfigured: true}
	for _, c := range []struct {
		name string
		in   func(*Inputs)
		want []string // one substring per finding, in order
	}{
		{"all well", func(*Inputs) {}, nil},
		{"broken path", func(in *Inputs) { in.Paths = []health.PathStatus{down} }, []string{"gets no answer (vxlan path, since 2026-12-05T12:00:00Z)"}},
		{"unprobed peers are not problems", func(in *Inputs) {
			in.Paths = []health.PathStatus{{Peer: peer, Path: health.PathVXLAN, State: health.StateUnprobed}}
		}, nil},
		{"not probing", func(in *Inputs) { in.Probing = false }, []string{"not probed"}},
		{"settings", func(in *Inputs) {
			in.Settings = []Finding{{Area: "settings", Subject: "h2", Problem: "h2 uses VXLAN port 4790"}}
		}, []string{"VXLAN port 4790"}},
		{"wrong secret", func(in *Inputs) { in.Rejections = map[string]uint64{"decrypt": 3} }, []string{"another cluster secret (3 refused in the last minute"}},
		{"an unknown reason", func(in *Inputs) { in.Rejections = map[string]uint64{"new_reason": 1} }, []string{"gossip is refused"}},
		{"no secret", func(in *Inputs) { in.SecretConfigured = false }, []string{"--secret-file"}},
		{"no ESP", func(in *Inputs) { in.ESPUnsupported = "kernel lacks IPsec ESP" }, []string{"kernel lacks IPsec ESP"}},
		{"no nf_tables", func(in *Inputs) { in.NFTables = "nf_tables: protocol not supported" }, []string{"need nf_tables"}},
		{"refused network", func(in *Inputs) { in.Refused = map[string]string{"n1": "encrypted networks need a cluster secret"} }, []string{"its tasks fail on this host: encrypted"}},
		{"drift once", func(in *Inputs) { in.RepairPasses, in.LastRepair = 1, now.Add(-time.Minute) }, nil},
		{"drift that recurs", func(in *Inputs) { in.RepairPasses, in.LastRepair = 4, now.Add(-time.Minute) }, []string{"4 times since start, the last 1m0s ago"}},
		{"drift long ago", func(in *Inputs) { in.RepairPasses, in.LastRepair = 9, now.Add(-time.Hour) }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := healthy
			c.in(&in)
			r := Build(in)
			if r.OK != (len(c.want) == 0) || len(r.Findings) != len(c.want) {
				t.Fatalf("ok %v, findings %v; want %d findings", r.OK, r.Findings, len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(r.Findings[i].Problem, w) {
					t.Errorf("finding %d %q does not say %q", i, r.Findings[i].Problem, w)
				}
			}
		})
	}
}
