// Package fakelb is an in-memory servicelb.Programmer for tests. It
// records, per namespace path, the services a sandbox balances, validates
// input exactly as the real one does (servicelb.Normalize), keeps
// per-backend connection counts that survive Apply as the kernel's do, can
// simulate connections, can make a namespace disappear, and can inject a
// failure into any call.
package fakelb

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/overlay-plugin/overlay-plugin/internal/faults"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
)

// Op names a call for fault injection and counting.
type Op string

const (
	OpApply    Op = "Apply"
	OpCounters Op = "Counters"
	OpRemove   Op = "Remove"
	// Inside an Apply that changes the table, as the real one's two
	// ways: OpIncrement, the batch of just the services that differ
	// (tried when the sandbox has a table and no service changed its
	// name); OpReplace, the whole table (the first, and the fallback when
	// OpIncrement fails).
	OpIncrement Op = "Increment"
	OpReplace   Op = "Replace"
)

// Errors of Connect.
var (
	// ErrRefused: the VIP's service has no backends (the real rules reset
	// or refuse such a connection).
	ErrRefused = errors.New("connection refused")
	// ErrNoService: the sandbox balances no service with that VIP.
	ErrNoService = errors.New("no service with that VIP")
)

// sandbox is one namespace's table.
type sandbox struct {
	svcs   []servicelb.Service // normalized
	counts map[servicelb.Backend]uint64
	next   map[netip.Addr]int // round-robin position per VIP
}

// LB is the fake. The zero value is not usable; call New.
type LB struct {
	// mu guards the maps below. It is a leaf: nothing else is locked
	// while it is held, and the fault hook is called without it.
	mu        sync.Mutex
	sandboxes map[string]*sandbox // by namespace path; absent: no table
	gone      map[string]bool     // namespace paths that no longer exist

	faults faults.Injector[Op] // locks itself, a leaf

	replaces, increments, fallbacks atomic.Uint64 // Stats
}

// New returns a fake in which every namespace path exists (until Vanish)
// and has no table.
func New() *LB {
	return &LB{sandboxes: map[string]*sandbox{}, gone: map[string]bool{}}
}

// SetFault installs a hook consulted before every call; a non-nil error
// fails the call with no state change. nil removes it.
func (f *LB) SetFault(hook func(op Op, nsPath string) error) { f.faults.Set(hook) }

// Calls reports how many times op got past fault injection.
func (f *LB) Calls(op Op) int { return f.faults.Calls(op) }

// Vanish makes the namespace at nsPath disappear, with its table, as when
// a container stops: Apply and Counters then fail with
// servicelb.ErrNoSandbox, Remove succeeds.
func (f *LB) Vanish(nsPath string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, nsPath)
	f.gone[nsPath] = true
}

// Services returns what the sandbox at nsPath balances, normalized (sorted
// by VIP, backends sorted), and whether it has a table at all.
func (f *LB) Services(nsPath string) ([]servicelb.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[nsPath]
	if !ok {
		return nil, false
	}
	out := make([]servicelb.Service, len(sb.svcs))
	for i, s := range sb.svcs {
		out[i] = s
		out[i].Backends = slices.Clone(s.Backends)
	}
	return out, true
}

// Sandboxes lists the namespace paths that have a table, sorted.
func (f *LB) Sandboxes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.sandboxes))
	for p := range f.sandboxes {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Connect simulates a new connection from the sandbox at nsPath to vip: it
// picks the service's backends in turn (the kernel picks at random),
// counts the connection and returns the backend.
func (f *LB) Connect(nsPath string, vip netip.Addr) (netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[nsPath] {
		return netip.Addr{}, fmt.Errorf("fakelb: %s: %w", nsPath, servicelb.ErrNoSandbox)
	}
	sb, ok := f.sandboxes[nsPath]
	if !ok {
		return netip.Addr{}, fmt.Errorf("fakelb: %s to %s: %w", nsPath, vip, ErrNoService)
	}
	i, ok := slices.BinarySearchFunc(sb.svcs, vip, func(s servicelb.Service, v netip.Addr) int { return s.VIP.Compare(v) })
	if !ok {
		return netip.Addr{}, fmt.Errorf("fakelb: %s to %s: %w", nsPath, vip, ErrNoService)
	}
	bs := sb.svcs[i].Backends
	if len(bs) == 0 {
		return netip.Addr{}, fmt.Errorf("fakelb: %s to %s: %w", nsPath, vip, ErrRefused)
	}
	b := bs[sb.next[vip]%len(bs)]
	sb.next[vip]++
	sb.counts[servicelb.Backend{VIP: vip, Addr: b}]++
	return b, nil
}

// Apply validates svcs as the real Programmer does, then records them. A
// backend that stays keeps its count; one removed loses it (the kernel
// deletes its chain, counter included), so it starts again from zero if
// it comes back. A change goes the real one's ways: an increment if the
// sandbox has a table and no service was renamed, else or if that fails
// (OpIncrement) a replace (OpReplace), whose failure changes nothing.
func (f *LB) Apply(nsPath string, svcs []servicelb.Service) error {
	norm, err := servicelb.Normalize(svcs)
	if err != nil {
		return err
	}
	if err := f.faults.Check(OpApply, nsPath); err != nil {
		return err
	}
	changed, incremental, err := f.plan(nsPath, norm)
	if err != nil || !changed {
		return err
	}
	if incremental {
		if f.faults.Check(OpIncrement, nsPath) == nil {
			f.increments.Add(1)
			return f.record(nsPath, norm)
		}
		f.fallbacks.Add(1)
	}
	if err := f.faults.Check(OpReplace, nsPath); err != nil {
		return err
	}
	f.replaces.Add(1)
	return f.record(nsPath, norm)
}

// plan says whether norm changes the sandbox's table, and if so whether
// an increment can: the sandbox has a table, keeps one, and no VIP's
// service changes its name.
func (f *LB) plan(nsPath string, norm []servicelb.Service) (changed, incremental bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[nsPath] {
		return false, false, fmt.Errorf("fakelb: %s: %w", nsPath, servicelb.ErrNoSandbox)
	}
	sb, ok := f.sandboxes[nsPath]
	if !ok {
		return len(norm) > 0, false, nil
	}
	if len(norm) == 0 {
		return true, false, nil
	}
	names := make(map[netip.Addr]string, len(sb.svcs))
	for _, s := range sb.svcs {
		names[s.VIP] = s.Name
	}
	incremental = true
	for _, s := range norm {
		if n, ok := names[s.VIP]; ok && n != s.Name {
			incremental = false
		}
	}
	return !reflect.DeepEqual(sb.svcs, norm), incremental, nil
}

// record makes norm the sandbox's table.
func (f *LB) record(nsPath string, norm []servicelb.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[nsPath] {
		return fmt.Errorf("fakelb: %s: %w", nsPath, servicelb.ErrNoSandbox)
	}
	if len(norm) == 0 {
		delete(f.sandboxes, nsPath)
		return nil
	}
	old := f.sandboxes[nsPath]
	if old == nil {
		old = &sandbox{} // reading its nil maps gives zeros
	}
	sb := &sandbox{svcs: norm, counts: map[servicelb.Backend]uint64{}, next: map[netip.Addr]int{}}
	for _, s := range norm {
		for _, a := range s.Backends {
			b := servicelb.Backend{VIP: s.VIP, Addr: a}
			sb.counts[b] = old.counts[b]
		}
		sb.next[s.VIP] = old.next[s.VIP]
	}
	f.sandboxes[nsPath] = sb
	return nil
}

// Stats counts the fake's replaces, increments and fallbacks; it writes
// no kernel objects.
func (f *LB) Stats() servicelb.Stats {
	return servicelb.Stats{Replaces: f.replaces.Load(), Increments: f.increments.Load(), Fallbacks: f.fallbacks.Load()}
}

// Counters returns the count of every backend the sandbox balances to,
// zero for those that never got a connection, as the kernel's counters.
func (f *LB) Counters(nsPath string) (map[servicelb.Backend]uint64, error) {
	if err := f.faults.Check(OpCounters, nsPath); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[nsPath] {
		return nil, fmt.Errorf("fakelb: %s: %w", nsPath, servicelb.ErrNoSandbox)
	}
	out := map[servicelb.Backend]uint64{}
	if sb, ok := f.sandboxes[nsPath]; ok {
		for b, n := range sb.counts {
			out[b] = n
		}
	}
	return out, nil
}

// Remove forgets the sandbox's table; neither a missing table nor a
// vanished namespace is an error.
func (f *LB) Remove(nsPath string) error {
	if err := f.faults.Check(OpRemove, nsPath); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, nsPath)
	return nil
}

var _ servicelb.Programmer = (*LB)(nil)
