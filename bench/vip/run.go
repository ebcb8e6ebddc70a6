// Package vip measures service VIPs at scale (issue 24): the real
// servicelb, in real client namespaces, on the running kernel. Services of
// a few tasks each on one network, a hundred client containers on the
// host: the time from a container's Join to every VIP balanced in it (its
// first table, one batch), and the time from one task change to every
// client's table updated, with the nf_tables objects and the CPU that
// change costs, the incremental way (this release) against the full
// replace (the earlier releases' every change, and still the resync),
// interleaved. Correctness is checked by connections, not assumed.
package vip

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
)

// Options configure Run.
type Options struct {
	Reps     int   `json:"reps"`
	Services []int `json:"services"` // a case per count
	Tasks    int   `json:"tasks"`    // per service
	Clients  int   `json:"clients"`
	// Changes of each way per repetition and case.
	Changes int `json:"changes"`
	// Parallel is how many clients a change programs at once, both ways:
	// the driver's bound (driver.lbParallel), since each container's
	// table is its own.
	Parallel int          `json:"parallel"`
	Progress func(string) `json:"-"`
}

// DefaultOptions are make bench's: issue 24's 1,000 services of 3 tasks
// and 100 clients, and 100 services to show what does not grow; one
// change of each way per repetition (a full replace of 100 tables of
// 1,000 services takes minutes).
func DefaultOptions() Options {
	return Options{Reps: 3, Services: []int{100, 1000}, Tasks: 3, Clients: 100, Changes: 1, Parallel: 4}
}

// The two ways a change is written.
const (
	Increment = "increment" // this release: the difference
	Replace   = "replace"   // before: the whole table (now the resync)
)

// Change is one timed task change, written to every client.
type Change struct {
	Way     string  `json:"way"`
	Service int     `json:"service"`
	Ms      float64 `json:"ms"`    // wall time, all clients in turn
	CPUMs   float64 `json:"cpuMs"` // the process's user+system time meanwhile
	// Objects are the nf_tables objects written per client.
	Objects float64 `json:"objectsPerClient"`
}

// Run is one repetition of one case.
type Run struct {
	Rep      int       `json:"rep"`
	Services int       `json:"services"`
	JoinMs   []float64 `json:"joinMs"` // per client
	// JoinCPUMs and JoinObjects are per client, averaged over them.
	JoinCPUMs   float64  `json:"joinCpuMs"`
	JoinObjects float64  `json:"joinObjects"`
	Changes     []Change `json:"changes"`
	Error       string   `json:"error,omitempty"`
}

// RunVIP runs every case Reps times, a fresh lab each time; a run that
// fails is recorded as such, and the report is then not Correct.
func RunVIP(o Options) *Report {
	r := &Report{Env: report.NewEnv(), Options: o, Correct: true}
	for rep := range o.Reps {
		for _, n := range o.Services {
			o.Progress(fmt.Sprintf("vip: rep %d/%d, %d services x %d tasks, %d clients", rep+1, o.Reps, n, o.Tasks, o.Clients))
			run := Run{Rep: rep, Services: n}
			if err := measure(o, &run); err != nil {
				run.Error = err.Error()
				r.Correct = false
				o.Progress("vip: " + run.Error)
			}
			r.Runs = append(r.Runs, run)
			r.Env.Sample()
		}
	}
	r.Env.Done()
	r.summarise(o)
	return r
}

// world is the services and the source of fresh task addresses.
type world struct {
	svcs []servicelb.Service
	next netip.Addr
}

func newWorld(services, tasks int) *world {
	w := &world{next: tasksRange.Addr()}
	vip := firstVIP
	for i := range services {
		s := servicelb.Service{Name: fmt.Sprintf("svc%d", i), VIP: vip}
		vip = vip.Next()
		for range tasks {
			s.Backends = append(s.Backends, w.task())
		}
		w.svcs = append(w.svcs, s)
	}
	return w
}

func (w *world) task() netip.Addr {
	w.next = w.next.Next()
	return w.next
}

// replaceTask replaces service i's first task by a new one (a task
// rescheduled, a rolling update's step): the services after the change.
func (w *world) replaceTask(i int) []servicelb.Service {
	out := make([]servicelb.Service, len(w.svcs))
	copy(out, w.svcs)
	s := &out[i]
	s.Backends = append(append([]netip.Addr{}, s.Backends[1:]...), w.task())
	w.svcs = out
	return out
}

func measure(o Options, run *Run) error {
	l, err := newLab(o.Clients)
	if err != nil {
		return err
	}
	defer l.close()
	w := newWorld(run.Services, o.Tasks)
	lb := servicelb.NewNftables()
	cpu0, st0 := cpuMs(), lb.Stats()
	for _, c := range l.clients {
		t := time.Now()
		if err := lb.Apply(c.path, w.svcs); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		run.JoinMs = append(run.JoinMs, ms(time.Since(t)))
	}
	run.JoinCPUMs = (cpuMs() - cpu0) / float64(len(l.clients))
	st := lb.Stats()
	run.JoinObjects = float64(st.Objects-st0.Objects) / float64(len(l.clients))
	if st.Replaces-st0.Replaces != uint64(len(l.clients)) {
		return fmt.Errorf("join: %+v -> %+v, want a replace per client", st0, st)
	}
	// Each client checks its share of the VIPs: together, every one.
	share := (len(w.svcs) + len(l.clients) - 1) / len(l.clients)
	if err := checkAll(l.clients, func(i int, c client) error {
		for j := range share {
			if err := balances(c, w.svcs[(i*share+j)%len(w.svcs)]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("after join: %w", err)
	}
	for k := range 2 * o.Changes {
		way := []string{Increment, Replace}[(k+run.Rep)%2]
		ch, err := change(l, lb, w, way, (run.Rep*7919+k*131)%len(w.svcs), o.Parallel)
		if err != nil {
			return fmt.Errorf("%s change %d: %w", way, k, err)
		}
		run.Changes = append(run.Changes, ch)
	}
	return nil
}

// change replaces one task of service i and writes it to every client,
// timed, the given way; then checks by connections that every client
// balances the service over exactly its new tasks. A replace is written
// by a fresh Programmer (nothing known: the full replace, as earlier
// releases wrote every change); lb then learns the tables again,
// untimed, by an Apply that finds them right and sends nothing.
func change(l *lab, lb servicelb.Programmer, w *world, way string, i, parallel int) (Change, error) {
	svcs := w.replaceTask(i)
	p := lb
	if way == Replace {
		p = servicelb.NewNftables()
	}
	st0, cpu0, t := p.Stats(), cpuMs(), time.Now()
	if err := applyAll(p, l.clients, svcs, parallel); err != nil {
		return Change{}, err
	}
	ch := Change{Way: way, Service: i, Ms: ms(time.Since(t)), CPUMs: cpuMs() - cpu0}
	st := p.Stats()
	ch.Objects = float64(st.Objects-st0.Objects) / float64(len(l.clients))
	n := uint64(len(l.clients))
	if (way == Increment && (st.Increments-st0.Increments != n || st.Replaces != st0.Replaces)) ||
		(way == Replace && st.Replaces-st0.Replaces != n) {
		return ch, fmt.Errorf("stats %+v -> %+v: not one %s per client", st0, st, way)
	}
	if way == Replace {
		for _, c := range l.clients {
			if err := lb.Apply(c.path, svcs); err != nil {
				return ch, err
			}
		}
	}
	return ch, checkAll(l.clients, func(_ int, c client) error { return balances(c, svcs[i]) })
}

// applyAll writes svcs to every client, parallel at a time.
func applyAll(p servicelb.Programmer, clients []client, svcs []servicelb.Service, parallel int) error {
	errs := make([]error, len(clients))
	slots := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			errs[i] = p.Apply(c.path, svcs)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// cpuMs is the process's user and system CPU time so far.
func cpuMs() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
