package encrypted

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// probeDetect is what issue 22 asks: a broken path named, and a healed one
// cleared, within 10 s.
const probeDetect = 10 * time.Second

// phaseESPFiltered: the switch drops IP protocol 50 and nothing else. Every
// host's check names each peer's ESP path with that cause while its plain
// VXLAN path stays up, and traffic on the plain network flows; once the
// rule goes, all is well again. The probes went through ESP all along:
// nothing else would tell protocol 50 from UDP 4789.
func (s *suite) phaseESPFiltered(t *testing.T) {
	s.waitChecks(t, "every path up before the filter", 30*time.Second, func(n *testbed.Node, r check.Report) error {
		esp := 0
		for _, p := range r.Paths {
			if p.State != health.StateUp {
				return fmt.Errorf("%s path to %s is %s", p.Path, p.Peer, p.State)
			}
			if p.Path == health.PathESP {
				esp++
			}
		}
		if esp != len(s.Nodes)-1 {
			return fmt.Errorf("%d ESP paths probed, want %d: %+v", esp, len(s.Nodes)-1, r.Paths)
		}
		return nil
	})
	sw := s.Topo.Switch
	nft := func(args ...string) {
		t.Helper()
		if _, err := sw.Exec(append([]string{"nft"}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	nft("add", "table", "bridge", "noesp")
	t.Cleanup(func() { sw.Exec("nft", "delete", "table", "bridge", "noesp") })
	nft("add", "chain", "bridge", "noesp", "filter", "{ type filter hook forward priority 0; }")
	nft("add", "rule", "bridge", "noesp", "filter", "ip", "protocol", "esp", "drop")
	took := s.waitChecks(t, "filtered ESP named", probeDetect, func(n *testbed.Node, r check.Report) error {
		named := 0
		for _, p := range r.Paths {
			switch {
			case p.Path == health.PathVXLAN && p.State != health.StateUp:
				return fmt.Errorf("the plain path to %s is %s while only ESP is filtered", p.Peer, p.State)
			case p.Path == health.PathESP && p.State == health.StateDown && strings.Contains(p.Problem, "IP protocol 50"):
				named++
			}
		}
		if named != len(s.Nodes)-1 {
			return fmt.Errorf("%d of %d ESP paths named: %v", named, len(s.Nodes)-1, r.Findings)
		}
		return nil
	})
	t.Logf("TIMING ESP filtered: every host's check named every peer's ESP path after %v", took)
	d1, d2 := s.byName["d1"], s.byName["d2"]
	if err := d1.Ctr.PingUntil(d2.addr(testbed.IPv4), 5*time.Second); err != nil {
		t.Errorf("the plain network stopped while only ESP is filtered: %v", err)
	}
	nft("delete", "table", "bridge", "noesp")
	took = s.waitChecks(t, "cleared", probeDetect, func(n *testbed.Node, r check.Report) error {
		for _, f := range r.Findings {
			if f.Area == "data path" {
				return errors.New(f.Problem)
			}
		}
		return nil
	})
	t.Logf("TIMING ESP allowed again: cleared on every host after %v", took)
}

// waitChecks polls every host's check until cond holds on all, and returns
// how long that took; it fails t after limit.
func (s *suite) waitChecks(t *testing.T, what string, limit time.Duration, cond func(*testbed.Node, check.Report) error) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var errs []error
		for _, n := range s.Nodes {
			var r check.Report
			err := n.Plugin.AdminJSON("/v1/check", &r)
			if err == nil {
				err = cond(n, r)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			}
		}
		if len(errs) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v: %v", what, limit, errors.Join(errs...))
		}
		time.Sleep(poll)
	}
}
