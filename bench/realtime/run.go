package realtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"regexp"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Result is one run of one system.
type Result struct {
	System string `json:"system"`
	Rep    int    `json:"rep"`
	Params Params `json:"params"`
	// Converged: every endpoint reached every other host within Timeout
	// of the first publish.
	Converged          bool     `json:"converged"`
	Correct            bool     `json:"correct"`
	Errors             []string `json:"errors,omitempty"`
	EndpointsConverged int      `json:"endpointsConverged"`
	PairsSeen          int64    `json:"pairsSeen"`
	PairsWanted        int64    `json:"pairsWanted"`

	MembershipSec float64 `json:"membershipSec"` // start of the hosts → all see all alive
	NetworkSec    float64 `json:"networkSec"`    // network joined → all hosts see all as its members
	PublishSec    float64 `json:"publishSec"`    // first → last publish
	ConvergedSec  float64 `json:"convergedSec"`  // first publish → last endpoint everywhere (or the give-up time)
	CloseSec      float64 `json:"closeSec"`      // closing every host (graceful leave), all at once

	// Latency in seconds from an endpoint's publish until it was seen on
	// all other hosts (Endpoint), or on one host (Pair); null where the
	// quantile falls among what never arrived.
	Endpoint Quantiles `json:"endpointLatency"`
	Pair     Quantiles `json:"pairLatency"`
	// Curve is the share converged, sampled every CurveStep since the
	// first publish.
	CurveStepSec  float64   `json:"curveStepSec"`
	EndpointCurve []float64 `json:"endpointShareCurve"`
	PairCurve     []float64 `json:"pairShareCurve"`

	// Wire bytes per host per second, mean over hosts, from the first
	// publish to convergence (or the give-up time).
	WireUDPPerHostSec float64 `json:"wireUdpBytesPerHostSec"`
	WireTCPPerHostSec float64 `json:"wireTcpBytesPerHostSec"`
	HeapPerHost       float64 `json:"heapBytesPerHost"` // live heap at the last collection before the window's end, less before start, per host
	CPUCores          float64 `json:"cpuCores"`         // cores busy from the first publish to convergence
	CPUSec            float64 `json:"cpuSec"`

	// MinAliveShare is the lowest share of (host, member) views that were
	// alive, sampled every second during the rollout: below 1 means some
	// host took another for failed.
	MinAliveShare float64 `json:"minAliveShare"`
	// Records are the plugin's own counters over all hosts during the
	// window; nil for NetworkDB.
	Records    *RecordCounts  `json:"records,omitempty"`
	Warnings   map[string]int `json:"warnings,omitempty"` // logged warnings and errors after the first publish, by message
	Goroutines int            `json:"goroutinesLeft"`     // more than before the run, after close
}

// Quantiles in seconds; nil where not reached.
type Quantiles struct {
	P50 *float64 `json:"p50"`
	P90 *float64 `json:"p90"`
	P99 *float64 `json:"p99"`
	Max *float64 `json:"max"`
}

const curveStep = 250 * time.Millisecond

// runOne runs the scenario against sys and returns its figures, or nil
// if set-up failed; err also reports a run that did not converge or ended
// with a wrong set somewhere.
func runOne(sys system, p Params, logs *logCounter, progress func(string)) (*Result, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	installWireCounter()
	res := &Result{System: sys.name(), Params: p, CurveStepSec: curveStep.Seconds()}
	eps := newEndpoints(p)
	tr := newTracker(p.Hosts, eps)
	gor0 := runtime.NumGoroutine()
	heap0 := liveHeap()

	defer func() {
		// Closing is bounded so that a host stuck in it cannot hang the
		// benchmark; it is reported, and the process exits at the end.
		t0 := time.Now()
		closed := make(chan struct{})
		go func() { sys.close(); close(closed) }()
		select {
		case <-closed:
			res.CloseSec = time.Since(t0).Seconds()
			// Goroutines of closed hosts may take a while to return.
			waitFor(sys.settle(), 100*time.Millisecond, func() bool { return runtime.NumGoroutine() <= gor0 })
			res.Goroutines = max(runtime.NumGoroutine()-gor0, 0)
		case <-time.After(p.Timeout):
			res.CloseSec = time.Since(t0).Seconds()
			res.Errors = append(res.Errors, fmt.Sprintf("hosts not closed within %v", p.Timeout))
			res.Correct = false
		}
	}()
	membership, network, err := sys.start(p, tr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sys.name(), err)
	}
	res.MembershipSec, res.NetworkSec = membership.Seconds(), network.Seconds()
	progress(fmt.Sprintf("%s: %d hosts alive in %.1fs, network joined in %.1fs", sys.name(), p.Hosts, res.MembershipSec, res.NetworkSec))

	// Rollout: in wave w every host publishes its endpoints
	// [w*batch, (w+1)*batch), all hosts in parallel; a wave starts every
	// WaveInterval (or when the previous one returned, if later).
	logs.arm()
	batch := p.perHost() / p.Waves
	udp0, tcp0 := wire.snapshot()
	rc0 := recordCounts(sys)
	cpu0 := cpuTime()
	first := time.Now()
	minAlive := atomic.Int64{}
	minAlive.Store(int64(p.Hosts * p.Hosts))
	// The sampler is not waited for: a NetworkDB host under load can hold
	// a reader of ClusterPeers for minutes behind its bulk syncs.
	stopSampler := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopSampler:
				return
			case <-t.C:
				minAlive.Store(min(minAlive.Load(), int64(sys.aliveViews())))
			}
		}
	}()
	var pubErrs []error
	var mu sync.Mutex
	for w := range p.Waves {
		time.Sleep(time.Until(first.Add(time.Duration(w) * p.WaveInterval)))
		_ = parallel(p.Hosts, func(h int) error {
			for j := w * batch; j < (w+1)*batch; j++ {
				g := h*p.perHost() + j
				tr.pubAt[g].Store(tr.now())
				if err := sys.publish(h, g); err != nil {
					mu.Lock()
					pubErrs = append(pubErrs, fmt.Errorf("publish endpoint %d on %s: %w", g, hostName(h), err))
					mu.Unlock()
				}
			}
			return nil
		})
	}
	res.PublishSec = time.Since(first).Seconds()

	last := time.Now()
	res.Converged = waitFor(time.Until(first.Add(p.Timeout)), 10*time.Millisecond, func() bool {
		if time.Since(last) >= 5*time.Second {
			last = time.Now()
			progress(fmt.Sprintf("%s t+%.0fs: %d/%d endpoints everywhere, %d/%d pairs", sys.name(), time.Since(first).Seconds(),
				tr.done.Load(), p.Endpoints, tr.pairs.Load(), int64(p.Endpoints)*int64(p.Hosts-1)))
		}
		return tr.done.Load() == int64(p.Endpoints)
	})
	end, endNs := time.Now(), tr.now()
	window := end.Sub(first)
	cpu := cpuTime() - cpu0
	udp1, tcp1 := wire.snapshot()
	if rc0 != nil {
		res.Records = recordCounts(sys).since(rc0)
	}
	close(stopSampler)
	res.Warnings = logs.disarm()
	res.ConvergedSec = window.Seconds()
	res.CPUSec = cpu.Seconds()
	res.CPUCores = cpu.Seconds() / window.Seconds()
	res.WireUDPPerHostSec = float64(udp1-udp0) / float64(p.Hosts) / window.Seconds()
	res.WireTCPPerHostSec = float64(tcp1-tcp0) / float64(p.Hosts) / window.Seconds()
	res.MinAliveShare = float64(minAlive.Load()) / float64(p.Hosts*p.Hosts)
	res.figures(tr, first, endNs)
	// As of the last collection: forcing one here took minutes at 100
	// NetworkDB hosts, whose goroutines keep both cores busy.
	res.HeapPerHost = (float64(heapAfterLastGC()) - float64(heap0)) / float64(p.Hosts)

	// Correctness: after convergence, give late updates (a wrong value
	// replaced, an extra delete) a moment, then check every host.
	var errs []error
	errs = append(errs, pubErrs...)
	if tr.foreign.Load() > 0 {
		errs = append(errs, fmt.Errorf("%d events for unknown or own endpoints", tr.foreign.Load()))
	}
	if res.Converged {
		time.Sleep(time.Second)
		for h := range p.Hosts {
			errs = append(errs, tr.verify(h), sys.verifyTable(h))
		}
	} else {
		errs = append(errs, fmt.Errorf("did not converge within %v: %d of %d endpoints on every other host, %d of %d pairs",
			p.Timeout, res.EndpointsConverged, p.Endpoints, res.PairsSeen, res.PairsWanted))
	}
	for _, e := range errs {
		if e != nil && len(res.Errors) < 20 {
			res.Errors = append(res.Errors, e.Error())
		}
	}
	res.Correct = res.Converged && len(res.Errors) == 0
	return res, errors.Join(errs...)
}

// figures computes the latencies and curves from the tracker, counting
// only what was seen by end (ns on the tracker's clock): hosts keep
// receiving after the give-up time.
func (res *Result) figures(tr *tracker, first time.Time, end int64) {
	base := int64(first.Sub(tr.t0))
	n := len(tr.eps.ids)
	ep := make([]float64, 0, n)
	pair := make([]float64, 0, n*(tr.hosts-1))
	var epDone, pairDone []float64 // since the first publish
	for g := range n {
		pub := tr.pubAt[g].Load()
		if d := tr.doneAt[g].Load(); d > 0 && d <= end {
			ep = append(ep, time.Duration(d-pub).Seconds())
			epDone = append(epDone, time.Duration(d-base).Seconds())
		} else {
			ep = append(ep, math.Inf(1))
		}
		for h := range tr.hosts {
			if tr.eps.owner(g) == h {
				continue
			}
			if s := tr.seenAt[h*n+g].Load(); s > 0 && s <= end {
				pair = append(pair, time.Duration(s-pub).Seconds())
				pairDone = append(pairDone, time.Duration(s-base).Seconds())
			} else {
				pair = append(pair, math.Inf(1))
			}
		}
	}
	res.EndpointsConverged = len(epDone)
	res.PairsSeen, res.PairsWanted = int64(len(pairDone)), int64(len(pair))
	res.Endpoint, res.Pair = quantiles(ep), quantiles(pair)
	res.EndpointCurve = curve(epDone, n, res.ConvergedSec)
	res.PairCurve = curve(pairDone, len(pair), res.ConvergedSec)
}

func quantiles(v []float64) Quantiles {
	slices.Sort(v)
	q := func(f float64) *float64 {
		x := v[min(int(math.Ceil(f*float64(len(v))))-1, len(v)-1)]
		if math.IsInf(x, 1) {
			return nil
		}
		return &x
	}
	return Quantiles{P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: q(1)}
}

// curve is the share of total whose time (in done) is at most each step.
func curve(done []float64, total int, until float64) []float64 {
	slices.Sort(done)
	var out []float64
	for i, t := 0, 0.0; t <= until+curveStep.Seconds(); t += curveStep.Seconds() {
		for i < len(done) && done[i] <= t {
			i++
		}
		out = append(out, float64(i)/float64(total))
	}
	return out
}

// liveHeap forces a collection and returns the heap it found live.
func liveHeap() uint64 {
	runtime.GC()
	return heapAfterLastGC()
}

// heapAfterLastGC is the heap the last collection found live.
func heapAfterLastGC() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// logCounter is an slog.Handler (for the plugin) and a logrus hook target
// (for NetworkDB, through containerd/log) that counts warnings and errors
// by message while armed.
type logCounter struct {
	mu    sync.Mutex
	armed bool
	msgs  map[string]int
}

func newLogCounter() *logCounter { return &logCounter{msgs: map[string]int{}} }

// Host names, addresses and ids vary per line; counting by the rest groups
// the lines that say the same thing.
var logVariable = regexp.MustCompile(`host\d+|\d+\.\d+\.\d+\.\d+(:\d+)?|[0-9a-f]{12,}`)

func (l *logCounter) count(msg string) {
	l.mu.Lock()
	if l.armed {
		l.msgs[logVariable.ReplaceAllString(msg, "…")]++
	}
	l.mu.Unlock()
}

func (l *logCounter) arm() {
	l.mu.Lock()
	l.armed = true
	clear(l.msgs)
	l.mu.Unlock()
}

func (l *logCounter) disarm() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	if len(l.msgs) == 0 {
		return nil
	}
	return maps.Clone(l.msgs)
}

func (l *logCounter) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.count(r.Message)
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
