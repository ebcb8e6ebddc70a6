package multihost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// Rolling upgrades (issue 20): release 0.1.0 and this build side by side
// with the gossip control plane on, and what a plugin stopped on purpose
// (SIGTERM: docker plugin disable, upgrade, set) leaves on the others.

// release010 is the commit of release 0.1.0, which speaks wire version 2
// only.
const release010 = "b9efa67"

// gossipConverge bounds the wait for the endpoint table to reach every
// host (test/gossip's bound: margin for a loaded 2-core machine).
const gossipConverge = 30 * time.Second

// buildRelease010 builds 0.1.0's plugin binary from this repository's own
// history (git archive of the commit, then the release build's go build),
// or skips when the history lacks the commit (a shallow clone).
func buildRelease010(t *testing.T) string {
	t.Helper()
	root, err := testbed.ModuleRoot()
	if err != nil {
		t.Skipf("no module root to find 0.1.0's source in: %v", err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git to build release 0.1.0 from the repository's history")
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", release010+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("the repository's history lacks %s (release 0.1.0; a shallow clone?): %v %s", release010, err, strings.TrimSpace(string(out)))
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tarball := filepath.Join(dir, "src.tar")
	for _, args := range [][]string{
		{"git", "-C", root, "archive", "--format=tar", "-o", tarball, release010},
		{"tar", "-xf", tarball, "-C", src},
	} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	bin := filepath.Join(dir, "overlay-plugin-0.1.0")
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-trimpath", "-o", bin, "./cmd/overlay-plugin")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOEXPERIMENT=runtimesecret", "GOWORK=off", "GOFLAGS=-mod=mod")
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building 0.1.0 (%s) in %s: %v: %s", release010, src, err, out)
	}
	t.Logf("built release 0.1.0 (%s) in %v", release010, time.Since(start).Round(time.Second))
	return bin
}

// gossipNet is a network with one container per host.
type gossipNet struct {
	*testbed.Cluster
	nw  *testbed.Network
	eps []*testbed.Endpoint // by host
}

func newGossipNet(t *testing.T, cfg testbed.ClusterConfig) *gossipNet {
	t.Helper()
	cfg.Gossip = true
	tc, err := testbed.New(t).NewCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := &gossipNet{Cluster: tc}
	if err := g.WaitMembers(nil, gossipConverge, "initial membership"); err != nil {
		t.Fatal(err)
	}
	if g.nw, err = g.CreateNetwork(overlay); err != nil {
		t.Fatal(err)
	}
	for i, n := range g.Nodes {
		ep, err := g.RunContainer(n, g.nw, fmt.Sprintf("c%d", i+1), g.nw.Addrs(i+1)...)
		if err != nil {
			t.Fatal(err)
		}
		g.eps = append(g.eps, ep)
	}
	if _, err := g.WaitConverged(g.nw, nil, gossipConverge, "initial endpoints"); err != nil {
		t.Fatal(err)
	}
	return g
}

// stat reads a numeric field of n's gossip Stats; ok is false if the
// plugin's release has no such field.
func stat(t *testing.T, n *testbed.Node, name string) (v float64, ok bool) {
	t.Helper()
	view, err := n.ClusterView()
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	raw, ok := view.Stats[name]
	if !ok {
		return 0, false
	}
	f, isNum := raw.(float64)
	if !isNum {
		t.Fatalf("%s: stats %s = %v, not a number", n.Name, name, raw)
	}
	return f, true
}

// noWireRefusals: no host refused a gossip message as malformed (what
// 0.1.0 counts a message of another version as) or of a wire version it
// does not speak.
func (g *gossipNet) noWireRefusals(t *testing.T, nodes ...*testbed.Node) {
	t.Helper()
	for _, n := range nodes {
		if !n.Plugin.Running() {
			continue
		}
		for _, name := range []string{"DecodeErrors", "RejectedWireVersion"} {
			if v, ok := stat(t, n, name); ok && v != 0 {
				t.Errorf("%s counted %v %s", n.Name, v, name)
			}
		}
	}
}

func member(t *testing.T, obs *testbed.Node, name string) testbed.Member {
	t.Helper()
	v, err := obs.ClusterView()
	if err != nil {
		t.Fatalf("%s: %v", obs.Name, err)
	}
	for _, m := range v.Members {
		if m.Name == name {
			return m
		}
	}
	return testbed.Member{}
}

func waitMemberState(t *testing.T, obs *testbed.Node, name, want string, timeout time.Duration) {
	t.Helper()
	if err := wait.Until(timeout, 100*time.Millisecond, func() error {
		s, err := obs.MemberState(name)
		if err != nil {
			return err
		}
		if s != want {
			return fmt.Errorf("%s lists %s %q, want %q", obs.Name, name, s, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestMixedReleases: h2 runs release 0.1.0 (wire version 2 only), h1 and
// h3 this build (2..3), h2 and h3 joined through h1. Each host's endpoint
// reaches the others and is programmed there (peer table, neighbour and
// FDB entries, read in the sandboxes too) in both directions, traffic
// flows between all containers, and no host refuses a message of the
// other release. This build's hosts see h2's range as 2..2. A SIGTERM of
// h3 then announces its restart to h1 only (0.1.0 would refuse the
// message), which lists it restarting; h2 lists it gone and still refuses
// nothing.
func TestMixedReleases(t *testing.T) {
	requireTestbed(t)
	old := buildRelease010(t)
	g := newGossipNet(t, testbed.ClusterConfig{
		HostBin: func(h *testbed.Host) string {
			if h.Name == "h2" {
				return old
			}
			return ""
		},
	})
	h1, h2, h3 := g.Nodes[0], g.Nodes[1], g.Nodes[2]
	var ctrs []*testbed.Container
	for _, ep := range g.eps {
		ctrs = append(ctrs, ep.Ctr)
	}
	if err := testbed.CheckTraffic(ctrs, testbed.Traffic{FirstPing: firstPing, TCPSize: 64 << 10, TCPTimeout: tcpTimeout, EchoPort: echoPort}); err != nil {
		t.Fatal(err)
	}
	t.Log("ICMP and TCP between every pair of containers across 0.1.0 and this build")
	for _, obs := range []*testbed.Node{h1, h3} {
		if w := member(t, obs, "h2").Wire; w != "2..2" {
			t.Errorf("%s lists h2 (0.1.0) speaking %q, want 2..2", obs.Name, w)
		}
		for _, o := range []*testbed.Node{h1, h3} {
			if w := member(t, obs, o.Name).Wire; w != "2..3" {
				t.Errorf("%s lists %s speaking %q, want 2..3", obs.Name, o.Name, w)
			}
		}
	}
	if _, ok := stat(t, h2, "RejectedWireVersion"); ok {
		t.Error("h2 reports RejectedWireVersion: is it really 0.1.0?")
	}
	g.noWireRefusals(t, g.Nodes...)

	if err := h3.Plugin.Stop(0); err != nil {
		t.Fatal(err)
	}
	waitMemberState(t, h1, "h3", "restarting", 15*time.Second)
	waitMemberState(t, h2, "h3", "gone", 15*time.Second)
	if v, _ := stat(t, h1, "RestartsReceived"); v != 1 {
		t.Errorf("h1 received %v restart announcements, want 1", v)
	}
	time.Sleep(2 * time.Second) // anything late from h3's stop
	g.noWireRefusals(t, h1, h2)
	if log := h2.Plugin.Log(); strings.Contains(log, "malformed") || strings.Contains(log, "unsupported wire version") {
		t.Errorf("0.1.0's log has a refusal:\n%s", h2.Plugin.LogTail(40))
	}
}

// TestRestartGraceKeepsEndpoints: this build on every host, a dead grace
// of 3 s and a restart grace of 60 s. h3's plugin stopped with SIGTERM
// (what docker plugin disable does) announces its restart: kept stopped
// for four dead graces, its endpoint is still programmed on h1 and h2,
// which list it restarting. Started again (a new instance), it takes
// over; killed with SIGKILL then, its endpoint goes from h1 and h2 after
// the dead grace.
func TestRestartGraceKeepsEndpoints(t *testing.T) {
	requireTestbed(t)
	const deadGrace, restartGrace = 3 * time.Second, time.Minute
	g := newGossipNet(t, testbed.ClusterConfig{DeadGrace: deadGrace, RestartGrace: restartGrace,
		Plugin: testbed.PluginConfig{SandboxesOutlive: true}})
	h3 := g.Nodes[2]
	observers := g.Nodes[:2]
	all := func(obs *testbed.Node) []*testbed.Endpoint { // h3's endpoint included, though its plugin is stopped
		var out []*testbed.Endpoint
		for _, ep := range g.Live(g.nw) {
			if ep.Host != obs.Host {
				out = append(out, ep)
			}
		}
		return out
	}

	stopped := time.Now()
	if err := h3.Plugin.Stop(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("h3's plugin stopped with SIGTERM in %v", time.Since(stopped).Round(time.Millisecond))
	for _, o := range observers {
		waitMemberState(t, o, "h3", "restarting", 15*time.Second)
		m := member(t, o, "h3")
		if left := time.Until(m.KeptUntil); left < restartGrace-20*time.Second || left > restartGrace {
			t.Errorf("%s keeps h3's records until %v, %v from now; want about the restart grace of %v", o.Name, m.KeptUntil, left, restartGrace)
		}
	}
	time.Sleep(time.Until(stopped.Add(4 * deadGrace)))
	if d := g.Diffs(g.nw, all, true); len(d) != 0 {
		t.Fatalf("%v after h3's SIGTERM (dead grace %v): its endpoint must still be programmed:\n  %s", time.Since(stopped).Round(time.Millisecond), deadGrace, strings.Join(d, "\n  "))
	}
	for _, o := range observers {
		if s, _ := o.MemberState("h3"); s != "restarting" {
			t.Errorf("%s lists h3 %q past the dead grace, want restarting", o.Name, s)
		}
	}
	t.Logf("%v after the SIGTERM, h3's endpoint is still programmed on h1 and h2 (admin API and sandbox tables)", time.Since(stopped).Round(time.Millisecond))

	if err := g.Restart(h3); err != nil {
		t.Fatal(err)
	}
	if err := g.Enable(h3); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitMembers(nil, gossipConverge, "h3 back"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.WaitConverged(g.nw, nil, gossipConverge, "h3 back"); err != nil {
		t.Fatal(err)
	}
	g.noWireRefusals(t, g.Nodes...)

	killed := time.Now()
	if err := h3.Plugin.Kill(); err != nil {
		t.Fatal(err)
	}
	var gone time.Time
	if err := wait.Until(40*time.Second, 100*time.Millisecond, func() error {
		if d := g.Diffs(g.nw, nil, false); len(d) != 0 {
			return errors.New(strings.Join(d, "\n  "))
		}
		gone = time.Now()
		return nil
	}); err != nil {
		t.Fatalf("h3's endpoint still on h1 or h2 %v after its SIGKILL (dead grace %v): %v", time.Since(killed), deadGrace, err)
	}
	if took := gone.Sub(killed); took < deadGrace {
		t.Errorf("h3's endpoint removed %v after the SIGKILL: before the dead grace of %v", took, deadGrace)
	}
	t.Logf("after h3's SIGKILL its endpoint went from h1 and h2 in %v (dead grace %v)", gone.Sub(killed).Round(time.Millisecond), deadGrace)
	if d := g.Diffs(g.nw, nil, true); len(d) != 0 {
		t.Errorf("strict check after the removal:\n  %s", strings.Join(d, "\n  "))
	}
	for _, o := range observers {
		waitMemberState(t, o, "h3", "purged", 10*time.Second)
	}
}
