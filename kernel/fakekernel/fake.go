// Package fakekernel is an in-memory kernel.Kernel for tests. It records the
// sandboxes, veths, neighbour and FDB entries that would be programmed,
// enforces the same existence rules as the real kernel, and can inject a
// failure into any operation.
package fakekernel

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/internal/faults"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Op names an operation for fault injection.
type Op string

const (
	OpCreateSandbox Op = "CreateSandbox"
	OpDeleteSandbox Op = "DeleteSandbox"
	OpAddVeth       Op = "AddVeth"
	OpDeleteVeth    Op = "DeleteVeth"
	// Program's ops, each failed or counted on its own by its kind.
	OpSetNeighbor    Op = "SetNeighbor"
	OpDeleteNeighbor Op = "DeleteNeighbor"
	OpAddFDB         Op = "AddFDB"
	OpDeleteFDB      Op = "DeleteFDB"
	// Reads, dumps and the rest: a fault matrix fails these too.
	OpSandboxes      Op = "Sandboxes"
	OpInspect        Op = "Inspect"
	OpRepairSandbox  Op = "RepairSandbox"
	OpRemoveLeftover Op = "RemoveLeftovers"
	OpWatch          Op = "Watch"
	OpNeighbors      Op = "Neighbors"
	OpFDB            Op = "FDB"
)

// Ops lists every operation, for tests that fail each in turn.
var Ops = []Op{OpCreateSandbox, OpDeleteSandbox, OpAddVeth, OpDeleteVeth, OpSetNeighbor, OpDeleteNeighbor,
	OpAddFDB, OpDeleteFDB, OpSandboxes, OpInspect, OpRepairSandbox, OpRemoveLeftover, OpWatch, OpNeighbors, OpFDB}

// Sandbox is a snapshot of one sandbox's state.
type Sandbox struct {
	Spec      kernel.SandboxSpec
	Veths     map[string]kernel.Veth // by sandbox-end name
	Neighbors map[netip.Addr]hwaddr.MAC
	FDB       map[kernel.FDBEntry]bool
	// Broken maps a device (kernel.BridgeName, kernel.VXLANName or a veth's
	// sandbox end) to what is wrong with it: "missing" or "not on the
	// bridge". BreakDevice breaks them, RepairSandbox mends them.
	Broken map[string]string
	// unicast indexes FDB's unicast entries by MAC, so that replacing one
	// costs O(1) and not a scan: the scale test adds 10,000 per sandbox.
	unicast map[hwaddr.MAC]kernel.FDBEntry
}

func newSandbox(spec kernel.SandboxSpec) *Sandbox {
	return &Sandbox{Spec: spec, Veths: map[string]kernel.Veth{}, Neighbors: map[netip.Addr]hwaddr.MAC{},
		FDB: map[kernel.FDBEntry]bool{}, Broken: map[string]string{}, unicast: map[hwaddr.MAC]kernel.FDBEntry{}}
}

func (s *Sandbox) clone() *Sandbox {
	c := &Sandbox{
		Spec:      s.Spec,
		Veths:     make(map[string]kernel.Veth, len(s.Veths)),
		Neighbors: make(map[netip.Addr]hwaddr.MAC, len(s.Neighbors)),
		FDB:       make(map[kernel.FDBEntry]bool, len(s.FDB)),
		Broken:    maps.Clone(s.Broken),
	}
	for k, v := range s.Veths {
		c.Veths[k] = v
	}
	for k, v := range s.Neighbors {
		c.Neighbors[k] = v
	}
	for k, v := range s.FDB {
		c.FDB[k] = v
	}
	return c
}

// Kernel is the fake. The zero value is not usable; call New.
type Kernel struct {
	// mu guards the maps below. Only a watcher's mu is taken while it is
	// held; the fault hook is called without it.
	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	hostLinks map[string]string // host-end veth name -> sandbox
	// moved are host ends moved into a container (MoveToContainer).
	moved map[string]bool
	// vnis maps each sandbox's VXLAN identity to it: the kernel refuses a
	// second device with the same VNI, port and underlay family.
	vnis map[vxlanKey]string
	// watchers are the Watch subscriptions by sandbox.
	watchers map[string][]*watcher

	faults faults.Injector[Op] // locks itself, a leaf
}

type vxlanKey struct {
	vni  uint32
	port uint16
	v4   bool
}

func keyOf(spec kernel.SandboxSpec) vxlanKey {
	return vxlanKey{vni: spec.VNI, port: spec.Port, v4: spec.Local.Unmap().Is4()}
}

// New returns an empty fake kernel.
func New() *Kernel {
	return &Kernel{
		sandboxes: map[string]*Sandbox{},
		hostLinks: map[string]string{},
		moved:     map[string]bool{},
		vnis:      map[vxlanKey]string{},
		watchers:  map[string][]*watcher{},
	}
}

// MoveToContainer does what Docker does with a joined veth's host end:
// Inspect reports its pair attached from then on.
func (k *Kernel) MoveToContainer(hostName string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.moved[hostName] = true
}

// Inspect reports the sandbox's spec and its veths; a device BreakDevice
// removed leaves its part of the spec zero, as on the real kernel.
func (k *Kernel) Inspect(name string) (kernel.SandboxInfo, error) {
	if err := k.check(OpInspect, name); err != nil {
		return kernel.SandboxInfo{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.sandbox(name)
	if err != nil {
		return kernel.SandboxInfo{}, err
	}
	info := kernel.SandboxInfo{Spec: s.Spec}
	if s.Broken[kernel.VXLANName] == "missing" {
		info.Spec.VNI, info.Spec.Port, info.Spec.Local = 0, 0, netip.Addr{}
	}
	if s.Broken[kernel.BridgeName] == "missing" {
		info.Spec.MTU = 0
	}
	for _, v := range s.Veths {
		info.Veths = append(info.Veths, kernel.SandboxVeth{Name: v.SandboxName, Attached: k.moved[v.HostName]})
	}
	slices.SortFunc(info.Veths, func(a, b kernel.SandboxVeth) int { return strings.Compare(a.Name, b.Name) })
	return info, nil
}

// SetFault installs a hook consulted before every operation but the
// test helpers; a non-nil error fails the operation with no state change.
// nil removes it.
func (k *Kernel) SetFault(f func(op Op, sandbox string) error) { k.faults.Set(f) }

func (k *Kernel) check(op Op, sandbox string) error { return k.faults.Check(op, sandbox) }

// Calls reports how many times op succeeded past fault injection.
func (k *Kernel) Calls(op Op) int { return k.faults.Calls(op) }

// Snapshot returns a deep copy of every sandbox.
func (k *Kernel) Snapshot() map[string]*Sandbox {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]*Sandbox, len(k.sandboxes))
	for n, s := range k.sandboxes {
		out[n] = s.clone()
	}
	return out
}

// ReleaseEntries drops every sandbox's neighbour and FDB entries, as if
// they had been flushed from outside, and returns how many it dropped. The
// sandboxes and veths stay. A test calls it to tell the memory those
// entries take here from its own: a real kernel holds them outside the
// plugin's heap.
func (k *Kernel) ReleaseEntries() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, s := range k.sandboxes {
		n += len(s.Neighbors) + len(s.FDB)
		s.Neighbors, s.FDB, s.unicast = map[netip.Addr]hwaddr.MAC{}, map[kernel.FDBEntry]bool{}, map[hwaddr.MAC]kernel.FDBEntry{}
	}
	return n
}

// AddLeftover plants a sandbox as if a previous run had left it.
func (k *Kernel) AddLeftover(spec kernel.SandboxSpec) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sandboxes[spec.Name] = newSandbox(spec)
	k.vnis[keyOf(spec)] = spec.Name
}

func (k *Kernel) sandbox(name string) (*Sandbox, error) {
	s, ok := k.sandboxes[name]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", name, kernel.ErrNotFound)
	}
	return s, nil
}

// mutate runs a mutating operation on one sandbox: fault injection first,
// then f under mu with the sandbox.
func (k *Kernel) mutate(op Op, name string, f func(s *Sandbox) error) error {
	if err := k.check(op, name); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.sandbox(name)
	if err != nil {
		return err
	}
	return f(s)
}

// read runs a read-only operation on one sandbox's VXLAN device: fault
// injection first, then f under mu.
func read[T any](k *Kernel, op Op, name string, f func(s *Sandbox) []T) ([]T, error) {
	if err := k.check(op, name); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.vxlan(name)
	if err != nil {
		return nil, err
	}
	return f(s), nil
}

// vxlan returns the sandbox if its VXLAN device exists, as the entry
// operations need. Caller holds mu.
func (k *Kernel) vxlan(name string) (*Sandbox, error) {
	s, err := k.sandbox(name)
	if err != nil {
		return nil, err
	}
	if s.Broken[kernel.VXLANName] == "missing" {
		return nil, fmt.Errorf("sandbox %q: find %s: %w", name, kernel.VXLANName, kernel.ErrNotFound)
	}
	return s, nil
}

func (k *Kernel) CreateSandbox(spec kernel.SandboxSpec) error {
	if err := k.check(OpCreateSandbox, spec.Name); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.sandboxes[spec.Name]; ok {
		return fmt.Errorf("sandbox %q: %w", spec.Name, kernel.ErrExists)
	}
	if other, ok := k.vnis[keyOf(spec)]; ok {
		return fmt.Errorf("VXLAN VNI %d used by sandbox %q: %w", spec.VNI, other, kernel.ErrExists)
	}
	k.sandboxes[spec.Name] = newSandbox(spec)
	k.vnis[keyOf(spec)] = spec.Name
	return nil
}

func (k *Kernel) DeleteSandbox(name string) error {
	return k.mutate(OpDeleteSandbox, name, func(s *Sandbox) error {
		for _, v := range s.Veths {
			delete(k.hostLinks, v.HostName)
			delete(k.moved, v.HostName)
		}
		delete(k.vnis, keyOf(s.Spec))
		delete(k.sandboxes, name)
		return nil
	})
}

func (k *Kernel) Sandboxes() ([]string, error) {
	if err := k.check(OpSandboxes, ""); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	names := make([]string, 0, len(k.sandboxes))
	for n := range k.sandboxes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

func (k *Kernel) RemoveLeftovers(keep func(string) bool) error {
	if err := k.check(OpRemoveLeftover, ""); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, s := range k.sandboxes {
		if keep != nil && keep(name) {
			continue
		}
		for _, v := range s.Veths {
			delete(k.hostLinks, v.HostName)
			delete(k.moved, v.HostName)
		}
		delete(k.vnis, keyOf(s.Spec))
		delete(k.sandboxes, name)
	}
	return nil
}

func (k *Kernel) AddVeth(sandbox string, v kernel.Veth) error {
	return k.mutate(OpAddVeth, sandbox, func(s *Sandbox) error {
		if _, ok := k.hostLinks[v.HostName]; ok {
			return fmt.Errorf("link %q: %w", v.HostName, kernel.ErrExists)
		}
		if _, ok := s.Veths[v.SandboxName]; ok {
			return fmt.Errorf("link %q in sandbox %q: %w", v.SandboxName, sandbox, kernel.ErrExists)
		}
		if s.Broken[kernel.BridgeName] != "" {
			return fmt.Errorf("add veth %s: find %s in sandbox %q: %w", v.HostName, kernel.BridgeName, sandbox, kernel.ErrNotFound)
		}
		s.Veths[v.SandboxName] = v
		k.hostLinks[v.HostName] = sandbox
		return nil
	})
}

func (k *Kernel) DeleteVeth(sandbox, sandboxName string) error {
	return k.mutate(OpDeleteVeth, sandbox, func(s *Sandbox) error {
		v, ok := s.Veths[sandboxName]
		if !ok {
			return fmt.Errorf("link %q in sandbox %q: %w", sandboxName, sandbox, kernel.ErrNotFound)
		}
		delete(s.Veths, sandboxName)
		delete(s.Broken, sandboxName)
		delete(k.hostLinks, v.HostName)
		delete(k.moved, v.HostName)
		return nil
	})
}

func (k *Kernel) Neighbors(sandbox string) ([]kernel.Neighbor, error) {
	return read(k, OpNeighbors, sandbox, func(s *Sandbox) []kernel.Neighbor {
		out := make([]kernel.Neighbor, 0, len(s.Neighbors))
		for ip, mac := range s.Neighbors {
			out = append(out, kernel.Neighbor{IP: ip, MAC: mac})
		}
		return out
	})
}

func (k *Kernel) FDB(sandbox string) ([]kernel.FDBEntry, error) {
	return read(k, OpFDB, sandbox, func(s *Sandbox) []kernel.FDBEntry {
		out := make([]kernel.FDBEntry, 0, len(s.FDB))
		for e := range s.FDB {
			out = append(out, e)
		}
		return out
	})
}

// BreakDevice does to a sandbox what someone deleting a device there
// would: kernel.VXLANName takes its neighbour and FDB entries with it,
// kernel.BridgeName leaves every port off the bridge; any other name takes
// a veth's sandbox end off the bridge. Watchers hear of it.
func (k *Kernel) BreakDevice(sandbox, device string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.sandbox(sandbox)
	if err != nil {
		return err
	}
	switch device {
	case kernel.VXLANName:
		s.Broken[device] = "missing"
		s.Neighbors, s.FDB, s.unicast = map[netip.Addr]hwaddr.MAC{}, map[kernel.FDBEntry]bool{}, map[hwaddr.MAC]kernel.FDBEntry{}
	case kernel.BridgeName:
		s.Broken[device] = "missing"
		for name := range s.Veths {
			s.Broken[name] = "not on the bridge"
		}
		if s.Broken[kernel.VXLANName] == "" {
			s.Broken[kernel.VXLANName] = "not on the bridge"
		}
	default:
		if _, ok := s.Veths[device]; !ok {
			return fmt.Errorf("link %q in sandbox %q: %w", device, sandbox, kernel.ErrNotFound)
		}
		s.Broken[device] = "not on the bridge"
		return nil
	}
	k.emit(sandbox, kernel.Event{Kind: kernel.EventDevice, Device: device, Deleted: true, Broken: true})
	return nil
}

// RepairSandbox mends what BreakDevice broke: the bridge first, then the
// ports off it, then a missing VXLAN device (empty, as a new one is).
func (k *Kernel) RepairSandbox(spec kernel.SandboxSpec) ([]kernel.Repair, error) {
	var repairs []kernel.Repair
	err := k.mutate(OpRepairSandbox, spec.Name, func(s *Sandbox) error {
		if p := s.Broken[kernel.BridgeName]; p != "" {
			repairs = append(repairs, kernel.Repair{Device: kernel.BridgeName, Problem: p, Rebuilt: true})
			delete(s.Broken, kernel.BridgeName)
		}
		for _, name := range slices.Sorted(maps.Keys(s.Broken)) {
			if p := s.Broken[name]; p == "not on the bridge" {
				repairs = append(repairs, kernel.Repair{Device: name, Problem: p})
				delete(s.Broken, name)
			}
		}
		if p := s.Broken[kernel.VXLANName]; p != "" {
			repairs = append(repairs, kernel.Repair{Device: kernel.VXLANName, Problem: p, Rebuilt: true})
			delete(s.Broken, kernel.VXLANName)
		}
		for _, r := range repairs {
			if r.Rebuilt {
				k.emit(spec.Name, kernel.Event{Kind: kernel.EventDevice, Device: r.Device})
			}
		}
		return nil
	})
	return repairs, err
}

// watcher is one Watch subscription. Its queue is unbounded, so emitting
// under Kernel.mu never blocks; a goroutine forwards it to the channel.
type watcher struct {
	// mu guards queue. Leaf lock, taken under Kernel.mu.
	mu    sync.Mutex
	queue []kernel.Event
	wake  chan struct{} // cap 1: the queue grew
}

// emit queues e for the sandbox's watchers. Caller holds mu.
func (k *Kernel) emit(sandbox string, e kernel.Event) {
	for _, w := range k.watchers[sandbox] {
		w.mu.Lock()
		w.queue = append(w.queue, e)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (k *Kernel) Watch(ctx context.Context, sandbox string) (<-chan kernel.Event, error) {
	if err := k.check(OpWatch, sandbox); err != nil {
		return nil, err
	}
	k.mu.Lock()
	if _, err := k.sandbox(sandbox); err != nil {
		k.mu.Unlock()
		return nil, err
	}
	w := &watcher{wake: make(chan struct{}, 1)}
	k.watchers[sandbox] = append(k.watchers[sandbox], w)
	k.mu.Unlock()
	ch := make(chan kernel.Event)
	go func() {
		defer close(ch)
		defer func() {
			k.mu.Lock()
			k.watchers[sandbox] = slices.DeleteFunc(k.watchers[sandbox], func(x *watcher) bool { return x == w })
			if len(k.watchers[sandbox]) == 0 {
				delete(k.watchers, sandbox)
			}
			k.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
			w.mu.Lock()
			q := w.queue
			w.queue = nil
			w.mu.Unlock()
			for _, e := range q {
				select {
				case ch <- e:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}

var _ kernel.Kernel = (*Kernel)(nil)

// faultOp is the fault injection name of an entry op's kind.
var faultOp = map[kernel.EntryOpKind]Op{
	kernel.OpSetNeighbor: OpSetNeighbor, kernel.OpDeleteNeighbor: OpDeleteNeighbor,
	kernel.OpAddFDB: OpAddFDB, kernel.OpDeleteFDB: OpDeleteFDB,
}

// Program implements kernel.Kernel. Fault injection is per op, by its
// kind's Op. Like the real kernel's watch, Watch does not report what
// Program changed; OutsideChange is someone else's change, which it does.
func (k *Kernel) Program(sandbox string, ops []kernel.EntryOp) []error {
	if len(ops) == 0 {
		return nil
	}
	errs := make([]error, len(ops))
	failed := false
	for i := range ops {
		if op, ok := faultOp[ops[i].Kind]; ok {
			errs[i] = k.check(op, sandbox)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.vxlan(sandbox)
	for i := range ops {
		switch {
		case errs[i] != nil:
		case err != nil:
			errs[i] = fmt.Errorf("%s: %w", &ops[i], err)
		default:
			errs[i] = k.apply(s, sandbox, ops[i], false)
		}
		failed = failed || errs[i] != nil
	}
	if !failed {
		return nil
	}
	return errs
}

// OutsideChange applies ops to the sandbox as someone else would (an
// operator with ip or bridge): no fault injection, and watchers hear of
// each change.
func (k *Kernel) OutsideChange(sandbox string, ops ...kernel.EntryOp) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, err := k.vxlan(sandbox)
	if err != nil {
		return err
	}
	var errs []error
	for _, op := range ops {
		errs = append(errs, k.apply(s, sandbox, op, true))
	}
	return errors.Join(errs...)
}

// apply makes one entry change to s (the sandbox called name), with the
// real kernel's rules (kernel.Kernel's Program), telling watchers if
// report. Caller holds mu.
func (k *Kernel) apply(s *Sandbox, name string, op kernel.EntryOp, report bool) error {
	emit := func(e kernel.Event) {
		if report {
			k.emit(name, e)
		}
	}
	switch op.Kind {
	case kernel.OpSetNeighbor, kernel.OpDeleteNeighbor:
		ip := op.Neighbor.IP.Unmap()
		if !ip.IsValid() {
			return fmt.Errorf("%s in sandbox %q: invalid IP", &op, name)
		}
		if op.Kind == kernel.OpSetNeighbor {
			s.Neighbors[ip] = op.Neighbor.MAC
			emit(kernel.Event{Kind: kernel.EventNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: op.Neighbor.MAC}})
		} else if mac, ok := s.Neighbors[ip]; ok {
			delete(s.Neighbors, ip)
			emit(kernel.Event{Kind: kernel.EventNeighbor, Deleted: true, Neighbor: kernel.Neighbor{IP: ip, MAC: mac}})
		}
	case kernel.OpAddFDB, kernel.OpDeleteFDB:
		e := kernel.FDBEntry{MAC: op.FDB.MAC, VTEP: op.FDB.VTEP.Unmap()}
		if !e.VTEP.IsValid() || e.VTEP.IsUnspecified() {
			return fmt.Errorf("%s in sandbox %q: invalid VTEP", &op, name)
		}
		if op.Kind == kernel.OpAddFDB {
			if !e.MAC.IsZero() {
				// A unicast MAC has one destination: adding it again replaces.
				if old, ok := s.unicast[e.MAC]; ok {
					delete(s.FDB, old)
				}
				s.unicast[e.MAC] = e
			}
			s.FDB[e] = true
			emit(kernel.Event{Kind: kernel.EventFDB, FDB: e})
		} else if s.FDB[e] {
			delete(s.FDB, e)
			if s.unicast[e.MAC] == e {
				delete(s.unicast, e.MAC)
			}
			emit(kernel.Event{Kind: kernel.EventFDB, Deleted: true, FDB: e})
		}
	default:
		return fmt.Errorf("%s in sandbox %q: unknown op", &op, name)
	}
	return nil
}
