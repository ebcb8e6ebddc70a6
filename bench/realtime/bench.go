package realtime

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Options of a benchmark: Reps repetitions of the scenario, each running
// the plugin then NetworkDB, so slow drift of the machine hits both alike.
type Options struct {
	Params Params
	Reps   int
	// Systems names the systems to run, in this order within a
	// repetition (Systems); nil: all.
	Systems  []string
	Progress func(string) // nil: silent
}

// Systems are the systems a run can compare: the plugin's control plane
// without and with a secret (encrypted gossip), and Docker's NetworkDB.
var Systems = []string{"plugin", "plugin-secret", "networkdb"}

func newSystem(name string, logs *logCounter) (system, error) {
	switch name {
	case "plugin":
		return newPluginSystem(slog.New(logs), false), nil
	case "plugin-secret":
		return newPluginSystem(slog.New(logs), true), nil
	case "networkdb":
		return newNetworkDBSystem(), nil
	}
	return nil, fmt.Errorf("unknown system %q (have %s)", name, strings.Join(Systems, ", "))
}

// Report is a benchmark's results for one host count.
type Report struct {
	Params  Params    `json:"params"`
	Reps    int       `json:"reps"`
	Systems []string  `json:"systems"`
	Env     Env       `json:"env"`
	Summary []Figure  `json:"summary"`
	Runs    []*Result `json:"runs"`
}

// Env describes where the benchmark ran.
type Env struct {
	Started    time.Time         `json:"started"`
	Go         string            `json:"go"`
	GOMAXPROCS int               `json:"gomaxprocs"`
	CPU        string            `json:"cpu"`
	Kernel     string            `json:"kernel"`
	Commit     string            `json:"commit"`
	Modules    map[string]string `json:"modules"`
}

// Figure is one figure over the repetitions, per system. Ratio is the
// NetworkDB median over the plugin median, SecretRatio the plugin's with a
// secret over the plugin's without.
type Figure struct {
	Name         string   `json:"name"`
	Unit         string   `json:"unit"`
	Plugin       Spread   `json:"plugin"`
	PluginSecret Spread   `json:"pluginSecret"`
	NetworkDB    Spread   `json:"networkdb"`
	Ratio        *float64 `json:"ratioNetworkDBToPlugin"` // nil when either is missing
	SecretRatio  *float64 `json:"ratioSecretToPlugin"`    // nil when either is missing
}

// Spread is min/median/max over the runs that have the figure; N = 0: none.
type Spread struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

// Run runs the benchmark. Its error reports the runs that did not converge
// or ended with a wrong set on some host; the report holds their figures.
func Run(o Options) (*Report, error) {
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	if err := o.Params.check(); err != nil {
		return nil, err
	}
	if o.Systems == nil {
		o.Systems = Systems
	}
	rep := &Report{Params: o.Params, Reps: max(o.Reps, 1), Env: environment(), Systems: o.Systems}
	logs := newLogCounter()
	quietLogrus(logs)
	for _, name := range o.Systems {
		if _, err := newSystem(name, logs); err != nil {
			return nil, err
		}
	}
	var errs []error
	for r := range rep.Reps {
		for _, name := range o.Systems {
			sys, _ := newSystem(name, logs)
			o.Progress(fmt.Sprintf("rep %d/%d: %s, %d hosts, %d endpoints", r+1, rep.Reps, sys.name(), o.Params.Hosts, o.Params.Endpoints))
			res, err := runOne(sys, o.Params, logs, o.Progress)
			if res == nil {
				res = &Result{System: sys.name(), Params: o.Params, Errors: []string{err.Error()}}
			}
			res.Rep = r + 1
			rep.Runs = append(rep.Runs, res)
			if err != nil {
				errs = append(errs, fmt.Errorf("rep %d, %s: %w", r+1, sys.name(), err))
			}
			o.Progress(fmt.Sprintf("rep %d/%d: %s done: converged=%v correct=%v in %.1fs", r+1, rep.Reps, sys.name(), res.Converged, res.Correct, res.ConvergedSec))
			// Let the closed hosts' sockets and goroutines go before the
			// next run measures.
			time.Sleep(2 * time.Second)
		}
	}
	rep.summarise()
	return rep, errors.Join(errs...)
}

// figureDefs are the summary's figures; ok is false where a run lacks one.
var figureDefs = []struct {
	name, unit string
	get        func(*Result) (float64, bool)
	noRatio    bool // the systems do different things here
}{
	{"endpoint on all other hosts, p50", "s", qget(func(r *Result) *float64 { return r.Endpoint.P50 }), false},
	{"endpoint on all other hosts, p90", "s", qget(func(r *Result) *float64 { return r.Endpoint.P90 }), false},
	{"endpoint on all other hosts, p99", "s", qget(func(r *Result) *float64 { return r.Endpoint.P99 }), false},
	{"endpoint on all other hosts, max", "s", qget(func(r *Result) *float64 { return r.Endpoint.Max }), false},
	{"endpoint on one host (pair), p50", "s", qget(func(r *Result) *float64 { return r.Pair.P50 }), false},
	{"endpoint on one host (pair), p90", "s", qget(func(r *Result) *float64 { return r.Pair.P90 }), false},
	{"endpoint on one host (pair), p99", "s", qget(func(r *Result) *float64 { return r.Pair.P99 }), false},
	{"endpoint on one host (pair), max", "s", qget(func(r *Result) *float64 { return r.Pair.Max }), false},
	{"first publish → all converged (or gave up)", "s", rget(func(r *Result) float64 { return r.ConvergedSec }), false},
	{"endpoints converged", "share", rget(func(r *Result) float64 { return float64(r.EndpointsConverged) / float64(r.Params.Endpoints) }), false},
	{"pairs converged", "share", rget(func(r *Result) float64 { return float64(r.PairsSeen) / float64(r.PairsWanted) }), false},
	{"membership formed", "s", rget(func(r *Result) float64 { return r.MembershipSec }), false},
	// The plugin has no per-network membership: NetworkAdded is local.
	{"network joined everywhere", "s", rget(func(r *Result) float64 { return r.NetworkSec }), true},
	{"closing every host", "s", rget(func(r *Result) float64 { return r.CloseSec }), false},
	{"wire bytes sent per host, UDP", "B/s", rget(func(r *Result) float64 { return r.WireUDPPerHostSec }), false},
	{"wire bytes sent per host, TCP", "B/s", rget(func(r *Result) float64 { return r.WireTCPPerHostSec }), false},
	{"wire bytes sent per host, total", "B/s", rget(func(r *Result) float64 { return r.WireUDPPerHostSec + r.WireTCPPerHostSec }), false},
	{"heap per host", "KiB", rget(func(r *Result) float64 { return r.HeapPerHost / 1024 }), false},
	{"CPU during rollout", "cores", rget(func(r *Result) float64 { return r.CPUCores }), false},
	{"CPU during rollout", "CPU-s", rget(func(r *Result) float64 { return r.CPUSec }), false},
	// The plugin's own counters; NetworkDB keeps none such.
	{"stale deliveries per accepted record", "ratio", cget(func(c *RecordCounts) float64 { return c.StalePerAccepted }), true},
	{"records received per accepted record", "ratio", cget(func(c *RecordCounts) float64 { return c.ReceivedPerAccepted }), true},
	{"stale deliveries by push per accepted record", "ratio", cget(func(c *RecordCounts) float64 { return c.ratio(c.Stale.Push) }), true},
	{"stale deliveries by anti-entropy per accepted record", "ratio", cget(func(c *RecordCounts) float64 { return c.ratio(c.Stale.AntiEntropy) }), true},
	{"messages to members not sent", "count", cget(func(c *RecordCounts) float64 { return float64(c.PushesFailed) }), true},
	{"gossip streams refused unchecked", "count", cget(func(c *RecordCounts) float64 { return float64(c.StreamsRefused) }), true},
	{"lowest share of member views alive", "share", rget(func(r *Result) float64 { return r.MinAliveShare }), false},
}

func qget(f func(*Result) *float64) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		if v := f(r); v != nil {
			return *v, true
		}
		return 0, false
	}
}

// cget reads a figure of the plugin's record counters.
func cget(f func(*RecordCounts) float64) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		if r.Records == nil || r.Records.Accepted == 0 {
			return 0, false
		}
		return f(r.Records), true
	}
}

// rget reads a figure every run that got past set-up has.
func rget(f func(*Result) float64) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) { return f(r), r.PairsWanted > 0 }
}

func (rep *Report) summarise() {
	for _, d := range figureDefs {
		f := Figure{Name: d.name, Unit: d.unit}
		for sys, to := range map[string]*Spread{"plugin": &f.Plugin, "plugin-secret": &f.PluginSecret, "networkdb": &f.NetworkDB} {
			var v []float64
			for _, r := range rep.Runs {
				if x, ok := d.get(r); ok && r.System == sys {
					v = append(v, x)
				}
			}
			*to = spread(v)
		}
		f.Ratio = ratio(f.NetworkDB, f.Plugin, d.noRatio)
		f.SecretRatio = ratio(f.PluginSecret, f.Plugin, false)
		rep.Summary = append(rep.Summary, f)
	}
}

// ratio is a's median over b's, nil where either is missing.
func ratio(a, b Spread, none bool) *float64 {
	if none || a.N == 0 || b.N == 0 || b.Median == 0 {
		return nil
	}
	r := a.Median / b.Median
	return &r
}

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Spread{N: len(v), Min: v[0], Median: med, Max: v[len(v)-1]}
}

func environment() Env {
	e := Env{Started: time.Now().UTC(), Go: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), Modules: map[string]string{}}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		e.Commit = strings.TrimSpace(string(out))
	}
	// The versions that ran: one memberlist serves both systems (Go picks
	// the highest any module requires).
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			switch m.Path {
			case "github.com/hashicorp/memberlist", "github.com/moby/moby/v2", "github.com/hashicorp/go-metrics":
				e.Modules[m.Path] = m.Version
			}
		}
	}
	return e
}
