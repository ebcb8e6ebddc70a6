package driver

// The reconciler: level-triggered, one per network. Desired state is the
// network's peer db (every remote binding a neighbour entry, every
// (MAC, VTEP) an FDB entry, with the flood option a flood entry per remote
// VTEP) and its sandbox's devices; actual state is read back from the
// kernel.
//
// Programming is one path, desired -> apply -> resync on error (as Felix's
// vxlanfdb): every change goes into the peer db first; apply (network.go)
// has the network's planner (planner.go) plan what the change makes
// differ, without reading the kernel back; any error of it kicks this
// reconciler, which reads the kernel back and has the planner resync the
// whole. It also runs on the sandbox's drift events, at start and
// periodically (Run). Both halves run the planner's work through execute,
// in its one order, under the network's lock, so they never interleave.

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Repair kinds, the label values of the repairs counter.
const (
	RepairNeighborAdded    = "neighbor_added"
	RepairNeighborReplaced = "neighbor_replaced"
	RepairNeighborRemoved  = "neighbor_removed"
	RepairFDBAdded         = "fdb_added"
	RepairFDBReplaced      = "fdb_replaced"
	RepairFDBRemoved       = "fdb_removed"
	RepairDeviceRebuilt    = "device_rebuilt"
	RepairDeviceFixed      = "device_fixed"
)

// RepairKinds lists the repair kinds in a stable order.
var RepairKinds = []string{RepairNeighborAdded, RepairNeighborReplaced, RepairNeighborRemoved,
	RepairFDBAdded, RepairFDBReplaced, RepairFDBRemoved, RepairDeviceRebuilt, RepairDeviceFixed}

// repairCounters counts every repair since start, by kind. Atomic: bumped
// under network locks, read by metrics scrapes.
type repairCounters [8]atomic.Uint64

func (c *repairCounters) add(kind string, n int) {
	for i, k := range RepairKinds {
		if k == kind {
			c[i].Add(uint64(n))
			return
		}
	}
}

// Repairs returns how many repairs of each kind the reconciler made since
// the driver started.
func (d *Driver) Repairs() map[string]uint64 {
	out := make(map[string]uint64, len(RepairKinds))
	for i, k := range RepairKinds {
		out[k] = d.repairs[i].Load()
	}
	return out
}

// RepairPasses says how many reconciler passes repaired something since
// the driver started, and when the last did (zero: none): drift that
// keeps coming back is someone else changing the overlay's kernel state.
func (d *Driver) RepairPasses() (uint64, time.Time) {
	n := d.repairPasses.Load()
	if n == 0 {
		return 0, time.Time{}
	}
	return n, time.Unix(0, d.lastRepair.Load())
}

// pass is what one reconcile did to one network, for the counters and the
// log.
type pass struct {
	counts map[string]int
	// what describes the first few repairs, for the log line.
	what []string
	// fill marks the first programming of a sandbox just built: the
	// entries it adds are its peers going in, not repairs, and go to
	// filled; anything else it finds is drift and counts.
	fill   bool
	filled int
}

// maxLogged bounds the repairs one log line names: a rebuilt VXLAN device
// is refilled with every entry of the network.
const maxLogged = 5

func (p *pass) note(kind, format string, args ...any) {
	if p.fill && (kind == RepairNeighborAdded || kind == RepairFDBAdded) {
		p.filled++
		return
	}
	if p.counts == nil {
		p.counts = map[string]int{}
	}
	p.counts[kind]++
	if len(p.what) < maxLogged {
		p.what = append(p.what, kind+": "+fmt.Sprintf(format, args...))
	}
}

func (p *pass) total() int {
	t := 0
	for _, c := range p.counts {
		t += c
	}
	return t
}

// Resync reconciles every network now, fully (see reconcile), and returns
// the entries it added (or replaced) and removed.
func (d *Driver) Resync() (added, removed int, err error) {
	var errs []error
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		p, err := d.reconcile(n, true)
		n.mu.Unlock()
		added += p.counts[RepairNeighborAdded] + p.counts[RepairNeighborReplaced] + p.counts[RepairFDBAdded] + p.counts[RepairFDBReplaced]
		removed += p.counts[RepairNeighborRemoved] + p.counts[RepairFDBRemoved]
		errs = append(errs, err)
	}
	return added, removed, errors.Join(errs...)
}

// reconcile makes n's sandbox what n's state implies: its devices, the
// IPsec references of its remote VTEPs (encrypted networks), and its
// neighbour and FDB entries. It counts and logs every repair and records
// the outcome for State. Without full, an adopted sandbox (the previous
// run's) keeps entries nothing wants as removable says: the remote
// endpoints the control plane has not delivered again yet look unwanted,
// and removing them would cut the traffic a restart is meant to keep.
// Caller holds n.mu.
func (d *Driver) reconcile(n *network, full bool) (pass, error) {
	var p pass
	err := d.reconcileInto(n, full, &p)
	return p, err
}

// fillSandbox programs every peer of n into the sandbox just built for
// it: a full reconcile whose additions are not counted as repairs. Caller
// holds n.mu.
func (d *Driver) fillSandbox(n *network) (entries int, err error) {
	p := pass{fill: true}
	err = d.reconcileInto(n, true, &p)
	return p.filled, err
}

// reconcileInto is reconcile, noting what it does in p. Caller holds n.mu.
func (d *Driver) reconcileInto(n *network, full bool, p *pass) error {
	if n.sandbox == "" || (n.opts.encrypted && !n.guarded) {
		n.reconcileErr = nil
		return nil
	}
	graceOver := time.Since(d.started) >= d.deadGrace
	if n.adopted && (full || d.peersSettled() && graceOver) {
		n.adopted = false
	}
	devErr := d.repairDevices(n, p)
	actual, readErr := d.readEntries(n)
	w := n.planner.Resync(n.peers.Bindings(), actual, n.opts.flood, d.removable(n, graceOver), p)
	err := errors.Join(devErr, readErr, d.execute(n, w))
	d.record(n, p)
	n.reconcileErr = err
	if err != nil {
		err = fmt.Errorf("reconcile network %s: %w", n.id, err)
	}
	return err
}

// record counts and logs what a pass repaired: one line per pass, which
// minGap spaces. Caller holds n.mu.
func (d *Driver) record(n *network, p *pass) {
	for kind, c := range p.counts {
		d.repairs.add(kind, c)
	}
	if p.total() > 0 {
		d.repairPasses.Add(1)
		d.lastRepair.Store(time.Now().UnixNano())
		d.log.Warn("sandbox repaired", "why", "the kernel differed from the network's state",
			"network", n.id, "repairs", p.counts, "first", strings.Join(p.what, "; "))
	}
}

// repairForJoin rebuilds the sandbox's devices before a Join uses them
// (a veth needs the bridge, a peer the VXLAN device), and refills a
// rebuilt VXLAN device at once. Only the devices are read: a Join must not
// cost a dump of every entry. Caller holds n.mu.
func (d *Driver) repairForJoin(n *network) error {
	var p pass
	err := d.repairDevices(n, &p)
	d.record(n, &p)
	if err != nil {
		return err
	}
	if p.total() > 0 {
		if _, err := d.reconcile(n, false); err != nil {
			n.kickLoop()
		}
	}
	return nil
}

// reconcileNow reconciles n at once, as a sandbox that could not take its
// peers until now needs; what fails is left to n's loop. Caller holds
// n.mu.
func (d *Driver) reconcileNow(n *network, what string) {
	if _, err := d.reconcile(n, false); err != nil {
		d.log.Warn(what, "network", n.id, "err", err)
		n.kickLoop()
	}
}

// repairDevices rebuilds what is missing or wrong of the sandbox's bridge
// and VXLAN device, in place. It needs this host's VTEP address, which a
// restarted plugin may learn only after it serves; until then it does
// nothing (SetDataPath triggers a reconcile). Caller holds n.mu.
func (d *Driver) repairDevices(n *network, p *pass) error {
	d.mu.Lock()
	vtep, port := d.vtep, d.port
	d.mu.Unlock()
	if !vtep.IsValid() {
		return nil
	}
	repairs, err := d.kernel.RepairSandbox(kernel.SandboxSpec{Name: n.sandbox, VNI: n.vni, Port: port, Local: vtep, MTU: n.mtu})
	for _, r := range repairs {
		kind := RepairDeviceFixed
		if r.Rebuilt {
			kind = RepairDeviceRebuilt
		}
		p.note(kind, "%s %s", r.Device, r.Problem)
	}
	return err
}

// removable says which entries nothing wants may go, by the VTEP they
// point at (invalid: unknown). Any, once n's sandbox is its own. In a
// sandbox adopted from the previous run: none until the control plane has
// re-delivered the remote endpoints (peersSettled); then those of hosts
// that are reachable (their endpoints are all known), and those of the
// others only once the dead grace has passed since start: a host that
// went away before it could re-deliver its endpoints to this new run
// keeps its containers' traffic here as long as every other host keeps
// it. Caller holds n.mu.
func (d *Driver) removable(n *network, graceOver bool) func(netip.Addr) bool {
	switch {
	case !n.adopted || graceOver && d.peersSettled():
		return func(netip.Addr) bool { return true }
	case !d.peersSettled():
		return func(netip.Addr) bool { return false }
	}
	cp := d.controlPlane()
	known := map[netip.Addr]bool{} // one question per VTEP, not per entry
	return func(vtep netip.Addr) bool {
		if cp == nil || !vtep.IsValid() {
			return false
		}
		ok, asked := known[vtep]
		if !asked {
			ok = cp.Delivered(vtep)
			known[vtep] = ok
		}
		return ok
	}
}

// readEntries reads back the entries of n's sandbox; nil if it cannot.
// Caller holds n.mu.
func (d *Driver) readEntries(n *network) (*sandboxEntries, error) {
	neighs, err := d.kernel.Neighbors(n.sandbox)
	if err != nil {
		return nil, err
	}
	fdb, err := d.kernel.FDB(n.sandbox)
	if err != nil {
		return nil, err
	}
	return &sandboxEntries{neighbors: neighs, fdb: fdb}, nil
}

// drifted reports whether a batch of the sandbox's events shows the kernel
// departing from n's state: our own programming produces events too, and
// those agree with it, so they never start a reconcile. Caller holds n.mu.
func drifted(n *network, events []kernel.Event) bool {
	if n.sandbox == "" || (n.opts.encrypted && !n.guarded) {
		return false
	}
	for _, e := range events {
		switch e.Kind {
		case kernel.EventLost:
			return true
		case kernel.EventDevice:
			if e.Broken {
				return true
			}
		case kernel.EventNeighbor:
			b, ok := n.peers.Owner(e.Neighbor.IP)
			want := ok && !b.Local
			if e.Deleted && want || !e.Deleted && (!want || b.MAC != e.Neighbor.MAC || e.Neighbor.NotPermanent) {
				return true
			}
		case kernel.EventFDB:
			want := n.planner.wantsFDB(e.FDB, n.opts.flood)
			if e.Deleted && want || !e.Deleted && (!want || e.FDB.NotPermanent) {
				return true
			}
		}
	}
	return false
}

// logEvery bounds how often a network's failing reconcile is logged.
const logEvery = 10 * time.Second

// errLog rate-limits a reconciler's error lines.
type errLog struct {
	last       time.Time
	suppressed int
}

func (l *errLog) log(log *slog.Logger, id string, err error) {
	if time.Since(l.last) < logEvery {
		l.suppressed++
		return
	}
	log.Warn("reconcile failed", "why", "retrying", "network", id, "err", err, "failures_not_logged", l.suppressed)
	l.last, l.suppressed = time.Now(), 0
}
