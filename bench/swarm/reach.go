package swarm

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// reachPort is where the measured containers listen (busybox httpd).
const reachPort = 7000

// ReachRun is one container's docker run → reachable.
type ReachRun struct {
	Rep    int    `json:"rep"`
	System string `json:"system"`
	// Case: "cold" (the network's first container on the node: the
	// driver builds its sandbox) or "warm" (the network already has a
	// container there).
	Case string `json:"case"`
	// RunReturnedMs: docker run -d returned; ReachableMs: the first TCP
	// connection from the other node's container was established. Both
	// from the moment docker run was called.
	RunReturnedMs float64 `json:"runReturnedMs"`
	ReachableMs   float64 `json:"reachableMs"`
	Attempts      int     `json:"attempts"`
	// Correct: reachable, and the container that answered GET / is the
	// one started (its hostname).
	Correct bool   `json:"correct"`
	Error   string `json:"error,omitempty"`
	Load    string `json:"loadavg"`
}

// ReachReport is the docker run → reachable figure.
type ReachReport struct {
	Env          report.Env `json:"env"`
	Reps         int        `json:"reps"`
	Plugin       string     `json:"plugin"`
	ProbeEveryMs float64    `json:"probeEveryMs"`
	Runs         []ReachRun `json:"runs"`
	// By case, then by system: reachable ms and docker run -d ms, and
	// reachable less docker run -d (how long a container stayed
	// unreachable after docker run returned; below 0: reachable before).
	Reachable   map[string]map[string]report.Stat `json:"reachableMs"`
	RunReturned map[string]map[string]report.Stat `json:"runReturnedMs"`
	AfterReturn map[string]map[string]report.Stat `json:"reachableAfterRunReturnedMs"`
	// Ratio by case: overlay ÷ plugin reachable time, per repetition
	// (above 1: the plugin's container is reachable sooner).
	Ratio map[string]report.Stat `json:"ratio"`
	// Correct: every plugin run reached the right container.
	Correct bool `json:"correct"`
}

var reachCases = []string{"cold", "warm"}

// RunReach runs the figure: per repetition, for the plugin and then
// Docker's overlay, a fresh attachable network; a prober container on
// Nodes[0]; then on Nodes[1] a first container (cold) and a second one
// (warm), each timed from docker run until the prober's TCP connection to
// it is established. Everything a repetition made is removed before the
// next.
func RunReach(o Options) (*ReachReport, error) {
	rep := &ReachReport{Env: report.NewEnv(), Reps: o.Reps, Plugin: o.Plugin, Correct: true,
		ProbeEveryMs: float64(o.ProbeEvery) / float64(time.Millisecond),
		Reachable:    map[string]map[string]report.Stat{}, RunReturned: map[string]map[string]report.Stat{},
		AfterReturn: map[string]map[string]report.Stat{}, Ratio: map[string]report.Stat{}}
	reach := map[string]map[string][]float64{}
	ret := map[string]map[string][]float64{}
	after := map[string]map[string][]float64{}
	ratio := map[string][]float64{}
	for _, c := range reachCases {
		reach[c], ret[c], after[c] = map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	}
	for r := range o.Reps {
		got := map[string]map[string]float64{}
		for si, sys := range []string{sysPlugin, sysOverlay} {
			// A subnet of its own per network, in 198.19.0.0/16 (the
			// half of RFC 2544's benchmarking range the e2e harness
			// leaves free): nothing of a removed network is reused.
			subnet := fmt.Sprintf("198.19.%d.0/24", 2*r+si)
			runs, err := o.reachRep(r, sys, subnet)
			for _, run := range runs {
				rep.Env.Sample()
				rep.Runs = append(rep.Runs, run)
				if sys == sysPlugin && !run.Correct {
					rep.Correct = false
				}
				if run.Correct {
					reach[run.Case][sys] = append(reach[run.Case][sys], run.ReachableMs)
					ret[run.Case][sys] = append(ret[run.Case][sys], run.RunReturnedMs)
					after[run.Case][sys] = append(after[run.Case][sys], run.ReachableMs-run.RunReturnedMs)
					if got[run.Case] == nil {
						got[run.Case] = map[string]float64{}
					}
					got[run.Case][sys] = run.ReachableMs
				}
				o.Progress(fmt.Sprintf("reach: rep %d: %s %s: docker run returned %.0f ms, reachable %.0f ms (%d attempts), correct %v %s(load %s)",
					r+1, sys, run.Case, run.RunReturnedMs, run.ReachableMs, run.Attempts, run.Correct, run.Error, run.Load))
			}
			if err != nil {
				// The set-up itself failed (network, prober): the
				// swarm is not usable for what follows.
				rep.Env.Done()
				if sys == sysPlugin {
					rep.Correct = false
				}
				return rep, fmt.Errorf("reach, rep %d, %s: %w", r+1, sys, err)
			}
		}
		for _, c := range reachCases {
			if p, m := got[c][sysPlugin], got[c][sysOverlay]; p > 0 && m > 0 {
				ratio[c] = append(ratio[c], m/p)
			}
		}
	}
	for _, c := range reachCases {
		rep.Reachable[c], rep.RunReturned[c], rep.AfterReturn[c] = map[string]report.Stat{}, map[string]report.Stat{}, map[string]report.Stat{}
		for sys, v := range reach[c] {
			rep.Reachable[c][sys] = report.NewStat(v)
		}
		for sys, v := range ret[c] {
			rep.RunReturned[c][sys] = report.NewStat(v)
		}
		for sys, v := range after[c] {
			rep.AfterReturn[c][sys] = report.NewStat(v)
		}
		rep.Ratio[c] = report.NewStat(ratio[c])
	}
	rep.Env.Done()
	return rep, nil
}

// reachRep is one system's repetition: the cold and the warm run. An error
// is a set-up failure; a run that fails is reported in its ReachRun.
func (o Options) reachRep(r int, sys, subnet string) (runs []ReachRun, err error) {
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil {
		return nil, err
	}
	ip := func(host byte) netip.Addr {
		a := prefix.Addr().As4()
		a[3] = host
		return netip.AddrFrom4(a)
	}
	network := fmt.Sprintf("obs-reach-%s-%d", sys, r+1)
	if err := o.createNetwork(sys, network, subnet); err != nil {
		return nil, err
	}
	prober := fmt.Sprintf("obs-probe-%s-%d", sys, r+1)
	names := map[string]string{}
	defer func() {
		var on1 []string
		for _, c := range reachCases {
			if names[c] != "" {
				on1 = append(on1, names[c])
			}
		}
		rm(o.Nodes[1], on1...)
		rm(o.Nodes[0], prober)
		if e := o.removeNetwork(network); e != nil && err == nil {
			err = e
		}
	}()
	p, err := o.run(o.Nodes[0], prober, network, ip(10).String(), "sleep", "86400")
	if err != nil {
		return nil, err
	}
	if err := fastNeighbourRetry(p.netns(), 10); err != nil {
		return nil, fmt.Errorf("prober's ARP retry: %w", err)
	}
	for i, c := range reachCases {
		names[c] = fmt.Sprintf("obs-%s-%s-%d", c, sys, r+1)
		run := o.reachOne(p, names[c], network, netip.AddrPortFrom(ip(byte(20+i)), reachPort))
		run.Rep, run.System, run.Case = r, sys, c
		runs = append(runs, run)
	}
	return runs, nil
}

// reachOne starts a web container on Nodes[1] and times it until the
// prober p reaches it; then checks that it is that container.
func (o Options) reachOne(p container, name, network string, dst netip.AddrPort) ReachRun {
	var run ReachRun
	fail := func(err error) ReachRun {
		run.Error = err.Error()
		run.Load = report.LoadAvg()
		return run
	}
	pr, err := startProbe(p.netns(), dst, o.ProbeEvery, o.ReachTimeout)
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	_, runErr := o.Nodes[1].docker(2*time.Minute, "run", "-d", "--name", name, "--hostname", name, "--network", network,
		"--ip", dst.Addr().String(), o.Image, "sh", "-c", fmt.Sprintf("hostname >/www/index.html; exec httpd -f -p %d -h /www", reachPort))
	run.RunReturnedMs = ms(time.Since(t0))
	res := <-pr.done // the prober gives up at ReachTimeout
	run.Attempts = res.attempts
	if runErr != nil {
		return fail(runErr)
	}
	if res.err != nil {
		return fail(res.err)
	}
	run.ReachableMs = ms(res.at.Sub(t0))
	body, err := httpGet(p.netns(), dst)
	if err != nil {
		return fail(fmt.Errorf("reachable, but GET / failed: %w", err))
	}
	if body != name {
		return fail(fmt.Errorf("GET http://%s/ answered %q, not %q", dst, body, name))
	}
	run.Correct = true
	run.Load = report.LoadAvg()
	return run
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
