// Package driver is the overlay network driver: Docker's remote network
// driver API (via go-plugins-helpers) on top of per-network sandboxes in the
// kernel and a per-network peer table.
//
// Locking follows moby's overlay driver after PR #50260. The plugin's whole
// lock order is internal/lockrank's graph (checked by make test); the
// driver's part, top to bottom:
//
//	network.mu  →  Driver.mu
//	network.mu  →  lbNamespace.mu (one per container) → servicelb's mutex
//	network.mu  →  lbSandboxes.mu, refusals.mu, groupCommit.mu
//	network.mu  →  the encryption mutex → Driver.mu
//	network.mu  →  the control plane's mutex
//	network.mu  →  the VXLAN source filter's mutex (a leaf)
//
// Each network's reconciler (reconcile.go, run.go) is a goroutine that
// takes its network's mu like any call; the fast path and the reconciler
// never interleave.
//
// Driver.mu guards only the network table and is the bottom lock of the
// driver: nothing is locked while it is held and no kernel call is made
// under it. lbSandboxes.mu (which containers have service VIP tables,
// lbsandboxes.go), refusals.mu (refusals.go) and groupCommit.mu are
// leaves; an lbNamespace.mu serialises one container's VIP table, taken
// by goroutines a network's balance starts and waits for.
// Each network has its own mu guarding everything about that network
// (endpoints, peer db, FDB refcounts, sandbox) and its kernel state, so
// operations on one network are serialised while distinct networks proceed
// in parallel; no network's mu is ever taken while holding another's.
// lockNetwork takes a network's lock with a double-checked lookup, so an
// operation never acts on a network that was deleted (or deleted and
// re-created) while it waited for the lock.
package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

// Errors a caller can test with errors.Is; messages carry the detail.
var (
	ErrNotFound = errors.New("not found")
	ErrInvalid  = errors.New("invalid request")
	ErrConflict = errors.New("conflict")
)

// Underlay answers questions about the host's own network.
type Underlay interface {
	// DefaultAddr is the address of the default-route interface.
	DefaultAddr() (netip.Addr, error)
	// MTU is the MTU of the interface that holds addr.
	MTU(addr netip.Addr) (int, error)
}

// Config builds a Driver.
type Config struct {
	Kernel   kernel.Kernel
	Underlay Underlay
	// VNIs allocates VXLAN ids when this node is the swarm leader.
	VNIs *vni.Allocator
	// DB keeps the networks and endpoints across restarts; nil keeps
	// nothing.
	DB *bbolt.DB
	// AdvertiseAddr is this host's VTEP address and VXLANPort the UDP
	// port of every VXLAN device. When either is unset, the caller
	// settles both later with SetDataPath (see AdvertiseAddr; the control
	// plane may learn the port from the members); until then joins wait.
	AdvertiseAddr netip.Addr
	VXLANPort     uint16
	// Encryption serves encrypted networks; nil when no cluster secret is
	// configured, which makes them an error.
	Encryption Encryption
	// ExpectEncryption says that an encryption side will be connected
	// (SetEncryption): a sandbox adopted from the kernel alone counts as
	// encrypted until it says whether the previous run guarded its VNI.
	ExpectEncryption bool
	// LoadBalancer programs service VIPs into containers (services.go);
	// nil: none.
	LoadBalancer LoadBalancer
	// Sources admits VXLAN of this host's networks only from the VTEPs it
	// may come from (vxlanfilter.Filter); nil: no filter.
	Sources Sources
	// SandboxDir is where Docker's namespace directory (the directory of
	// the SandboxKeys Docker passes) is mounted here; empty: SandboxKeys
	// are used as they are.
	SandboxDir string
	// ResyncPeriod is how often Run reconciles every network in full;
	// 0: DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// DeadGrace is how long the other hosts keep a gone host's endpoints
	// (the control plane's grace; 0: DefaultResyncPeriod). An adopted
	// sandbox keeps the entries of hosts that are not back for as long.
	DeadGrace time.Duration
	Logger    *slog.Logger
}

// Encryption is the IPsec side of encrypted networks (encryption.Manager).
// The driver calls it with a network lock held: its mutex sits below
// network.mu.
type Encryption interface {
	// Supported says why this kernel cannot encrypt, or nil.
	Supported() error
	// Overhead is what encryption adds to every VXLAN packet, taken off
	// the MTU of encrypted networks.
	Overhead() int
	// EnableVNI and DisableVNI guard a VNI in local use.
	EnableVNI(vni uint32) error
	DisableVNI(vni uint32) error
	// AddRemote and RemoveRemote take and drop a reference on the IPsec
	// state towards a remote VTEP.
	AddRemote(vtep netip.Addr) error
	RemoveRemote(vtep netip.Addr) error
	// Resumed says whether the previous run's IPsec state was taken over,
	// so that its encrypted sandboxes keep carrying traffic.
	Resumed() bool
	// Inherited says whether the previous run's firewall rules guard vni.
	Inherited(vni uint32) bool
}

// Sources is the VXLAN source filter. The driver calls it with a network
// lock held: its mutex sits below network.mu. A VNI is added before its
// VXLAN device exists, and a remote VTEP before the first FDB entry
// towards it is written (work.take), and each goes after its last user.
type Sources interface {
	SetPort(port uint16) error
	AddVNI(vni uint32) error
	RemoveVNI(vni uint32) error
	AddRemote(vtep netip.Addr) error
	RemoveRemote(vtep netip.Addr) error
	// Inherit admits vteps as the previous run's filter did, until
	// ReleaseInherited: the hosts an adopted sandbox still sends to.
	Inherit(vteps []netip.Addr) error
	// ReleaseInherited ends the admission of what the previous run's
	// filter admitted, once stale entries are removable (Run).
	ReleaseInherited() error
	// Repair rebuilds the filter if it was changed from outside.
	Repair() error
	// DroppedByVNI reads each VNI's drops; false when there is no filter
	// to read.
	DroppedByVNI() (map[uint32]uint64, bool)
}

// noSources is the filter when there is none.
type noSources struct{}

func (noSources) SetPort(uint16) error                    { return nil }
func (noSources) AddVNI(uint32) error                     { return nil }
func (noSources) RemoveVNI(uint32) error                  { return nil }
func (noSources) AddRemote(netip.Addr) error              { return nil }
func (noSources) RemoveRemote(netip.Addr) error           { return nil }
func (noSources) Inherit([]netip.Addr) error              { return nil }
func (noSources) ReleaseInherited() error                 { return nil }
func (noSources) Repair() error                           { return nil }
func (noSources) DroppedByVNI() (map[uint32]uint64, bool) { return nil, false }

// Driver implements go-plugins-helpers' network.Driver.
type Driver struct {
	kernel   kernel.Kernel
	underlay Underlay
	vnis     *vni.Allocator
	log      *slog.Logger
	store    store
	// enc is the encryption side, nil until SetEncryption (or without a
	// cluster secret). Atomic: read under network locks.
	enc atomic.Pointer[Encryption]
	// vtepSet is closed when vtep and port are set.
	vtepSet chan struct{}
	// cp is the control plane, nil until SetControlPlane. Atomic rather
	// than under mu: it is read under network locks on every join.
	cp atomic.Pointer[ControlPlane]
	// lb and sandboxDir program service VIPs (services.go); svcWatch is
	// told of endpoint changes, set once at start-up.
	lb         LoadBalancer
	lbNS       lbSandboxes
	sandboxDir string
	svcWatch   atomic.Pointer[func(string)]
	// sources is the VXLAN source filter (noSources without one); set
	// once by New.
	sources Sources
	// refused are the networks this host could not serve, for the
	// operator (refusals.go).
	refused refusals

	// resyncPeriod is Run's period; repairs counts the reconcilers'
	// repairs (atomic); settled is closed once the remote endpoints are
	// taken as known (run.go, settle).
	resyncPeriod time.Duration
	// started and deadGrace bound what an adopted sandbox keeps of the
	// hosts that are not back (reconcile, removable).
	started   time.Time
	deadGrace time.Duration
	repairs   repairCounters
	// macConflicts counts remote endpoints refused for a local MAC
	// (peers.go). Atomic: bumped under network locks.
	macConflicts atomic.Uint64
	// repairPasses and lastRepair (unix ns) are RepairPasses'. Atomic.
	repairPasses atomic.Uint64
	lastRepair   atomic.Int64
	// mtuFloor is SetMTUFloor's; nil until the control plane sets it.
	mtuFloor   atomic.Pointer[func() (int, string)]
	settled    chan struct{}
	settleOnce sync.Once
	// loops counts the networks' reconciler goroutines; Add is called
	// under mu while runCtx is set, Wait after Run cleared it.
	loops sync.WaitGroup

	// mu guards networks, vtep, port, discovered, nodes, runCtx and every
	// network's looping flag. Bottom of the lock order:
	// hold nothing else's lock while taking it and call nothing while
	// holding it.
	mu       lockrank.Mutex[lockrank.Driver]
	networks map[string]*network
	// vtep is this host's VTEP address once settled; it never changes
	// afterwards, since the other hosts program it. port is the VXLAN
	// port, given to New or settled with vtep.
	vtep netip.Addr
	port uint16
	// discovered is this node's address as Docker reported it, and
	// selfKnown is closed when it is first set.
	discovered netip.Addr
	selfKnown  chan struct{}
	// nodes are the other swarm nodes Docker reported.
	nodes map[netip.Addr]bool
	// runCtx is Run's context while it runs (new networks start their
	// loop with it), else nil.
	runCtx context.Context
}

// New returns a driver with the networks and endpoints of the previous run
// (see store.go). A sandbox that survived with joined endpoints or
// attached containers is adopted, so its containers keep their traffic
// across a plugin restart (an encrypted network's carries it once the
// encryption side is connected; see SetEncryption), and so is one the
// state database does not know; only provable leftovers are removed (see
// restore.go).
func New(cfg Config) (*Driver, error) {
	if cfg.Kernel == nil || cfg.Underlay == nil || cfg.VNIs == nil {
		return nil, errors.New("driver: Kernel, Underlay and VNIs are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &Driver{
		store:      newStore(cfg.DB),
		kernel:     cfg.Kernel,
		lb:         cfg.LoadBalancer,
		sources:    cfg.Sources,
		sandboxDir: cfg.SandboxDir,
		underlay:   cfg.Underlay,
		vnis:       cfg.VNIs,
		port:       cfg.VXLANPort,
		log:        log,
		networks:   map[string]*network{},
		nodes:      map[netip.Addr]bool{},
		vtepSet:    make(chan struct{}),
		selfKnown:  make(chan struct{}),
		settled:    make(chan struct{}),

		resyncPeriod: cfg.ResyncPeriod,
		started:      time.Now(),
		deadGrace:    cmp.Or(cfg.DeadGrace, DefaultResyncPeriod),
	}
	if d.resyncPeriod <= 0 {
		d.resyncPeriod = DefaultResyncPeriod
	}
	if d.sources == nil {
		d.sources = noSources{}
	}
	if cfg.AdvertiseAddr.IsValid() && cfg.VXLANPort != 0 {
		d.SetDataPath(cfg.AdvertiseAddr, cfg.VXLANPort)
	}
	if err := d.store.init(); err != nil {
		return nil, fmt.Errorf("state database: %w", err)
	}
	keep, err := d.restore(cfg.ExpectEncryption)
	if err != nil {
		return nil, fmt.Errorf("restore the previous run's networks: %w", err)
	}
	d.recoverVNIs()
	if err := cfg.Kernel.RemoveLeftovers(func(name string) bool { return keep[name] }); err != nil {
		return nil, fmt.Errorf("remove leftovers of a previous run: %w", err)
	}
	if cfg.Encryption != nil {
		d.SetEncryption(cfg.Encryption)
	}
	// Before serving: rebuild what broke in the adopted sandboxes while
	// the plugin was down. What fails is retried by Run.
	for _, id := range d.networkIDs() {
		if n := d.lockNetwork(id); n != nil {
			if n.sandbox != "" {
				d.filterAdopted(n)
			}
			if _, err := d.reconcile(n, false); err != nil {
				d.log.Warn("reconcile at start", "network", n.id, "err", err)
			}
			n.mu.Unlock()
		}
	}
	return d, nil
}

// filterAdopted filters the VNI of a sandbox the previous run left, at
// start, admitting first every host its FDB entries point at: the peer db
// is empty until the control plane delivers, and a previous run without
// a filter table (0.1.0, or one started with the filter off) left nothing
// to take over, yet the containers' traffic flows on. Caller holds n.mu.
func (d *Driver) filterAdopted(n *network) {
	var vteps []netip.Addr
	if entries, err := d.readEntries(n); err == nil {
		for _, e := range entries.fdb {
			if e.VTEP.IsValid() && !slices.Contains(vteps, e.VTEP) {
				vteps = append(vteps, e.VTEP)
			}
		}
	} else {
		d.log.Warn("adopted sandbox entries unread", "why", "its hosts are admitted as the members and peers arrive", "network", n.id, "err", err)
	}
	err := errors.Join(d.sources.Inherit(vteps), d.sources.AddVNI(n.vni))
	if err != nil {
		d.log.Warn("VXLAN source filter", "why", "the periodic repair retries", "network", n.id, "vni", n.vni, "err", err)
	}
}

// lockNetwork returns the network with the given id, locked, or nil. The
// table is read under d.mu, the network locked without it, and the table
// re-checked: if the network was removed or replaced meanwhile, the lookup
// starts over with what the table holds now.
func (d *Driver) lockNetwork(id string) *network {
	d.mu.Lock()
	n := d.networks[id]
	d.mu.Unlock()
	for n != nil {
		n.mu.Lock()
		d.mu.Lock()
		current := d.networks[id]
		d.mu.Unlock()
		if current == n {
			return n
		}
		n.mu.Unlock()
		n = current
	}
	return nil
}

// mustLockNetwork is lockNetwork with an error for unknown ids.
func (d *Driver) mustLockNetwork(id string) (*network, error) {
	if err := validID("network", id); err != nil {
		return nil, err
	}
	n := d.lockNetwork(id)
	if n == nil {
		return nil, fmt.Errorf("network %s: %w", id, ErrNotFound)
	}
	return n, nil
}

// networkIDs returns a copy of the table's keys.
func (d *Driver) networkIDs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.networks))
	for id := range d.networks {
		ids = append(ids, id)
	}
	return ids
}

// vtepWait bounds how long a join waits for the VTEP address and VXLAN
// port to be settled at start-up.
const vtepWait = 20 * time.Second

// dataPath is the address and port this host's VXLAN devices use, once
// settled.
func (d *Driver) dataPath() (netip.Addr, uint16, error) {
	select {
	case <-d.vtepSet:
	case <-time.After(vtepWait):
		return netip.Addr{}, 0, errors.New("this host's advertise address or VXLAN port is not settled yet (the plugin is starting); retry")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.vtep, d.port, nil
}

// localVTEP is dataPath's address.
func (d *Driver) localVTEP() (netip.Addr, error) {
	a, _, err := d.dataPath()
	return a, err
}

// SetDataPath settles this host's VTEP address and VXLAN port (a port
// given to New stays); later calls are ignored. The control plane must
// advertise the same.
func (d *Driver) SetDataPath(a netip.Addr, port uint16) {
	d.mu.Lock()
	if d.vtep.IsValid() {
		d.mu.Unlock()
		return
	}
	if d.port == 0 {
		d.port = port
	}
	port = d.port
	d.vtep = a.Unmap()
	close(d.vtepSet)
	// Sandboxes' devices can be repaired from now on.
	for _, n := range d.networks {
		n.kickLoop()
	}
	d.mu.Unlock()
	// Not under d.mu, the bottom lock: the filter programs the kernel.
	if err := d.sources.SetPort(port); err != nil {
		d.log.Warn("VXLAN source filter", "why", "the periodic repair retries", "port", port, "err", err)
	}
}

// AdvertiseAddr chooses this host's address: Docker's word for this node
// (DiscoverNew with Self), which arrives just after the plugin starts, if
// it comes within wait; else the default-route interface's address.
func (d *Driver) AdvertiseAddr(ctx context.Context, wait time.Duration) (netip.Addr, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-d.selfKnown:
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.discovered, nil
	case <-ctx.Done():
		return netip.Addr{}, ctx.Err()
	case <-t.C:
	}
	a, err := d.underlay.DefaultAddr()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no advertise address: Docker sent none and %w", err)
	}
	return a, nil
}

// SetEncryption connects the encryption side, and settles the adopted
// sandboxes of encrypted networks: their VNIs are guarded again and their
// peers programmed, with the previous run's IPsec state if it was taken
// over, else with new keys (the firewall's guard drops their traffic
// until then). A sandbox adopted from the kernel alone was encrypted if
// the previous run's firewall rules guard its VNI.
func (d *Driver) SetEncryption(e Encryption) {
	d.enc.Store(&e)
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		if n.unrecorded && n.opts.encrypted && !n.guarded && !e.Inherited(n.vni) {
			n.opts.encrypted = false
			d.reconcileNow(n, "program adopted sandbox")
		}
		if n.opts.encrypted && n.sandbox != "" && !n.guarded {
			d.settleAdopted(n, e)
		}
		n.mu.Unlock()
	}
}

// settleAdopted guards an adopted encrypted sandbox. One that cannot be
// guarded stays as it is, its peers waiting: removing it would take its
// containers' interfaces. Caller holds n.mu.
func (d *Driver) settleAdopted(n *network, e Encryption) {
	if err := e.EnableVNI(n.vni); err != nil {
		d.log.Error("adopted encrypted sandbox unguarded", "why", "its traffic stays blocked", "network", n.id, "vni", n.vni, "err", err)
		return
	}
	n.guarded = true
	d.reconcileNow(n, "program adopted encrypted sandbox")
	d.log.Info("adopted encrypted sandbox guarded again", "network", n.id, "vni", n.vni, "previous IPsec state taken over", e.Resumed())
}

func (d *Driver) encryption() Encryption {
	if p := d.enc.Load(); p != nil {
		return *p
	}
	return nil
}

// Close prepares a stop. Networks keep their sandboxes, so their
// containers' traffic flows on while the plugin restarts: an encrypted
// one's through the IPsec state the encryption side leaves in the kernel
// (encryption.Manager.Detach) for the next run to take over. Calls
// arriving meanwhile find no networks.
func (d *Driver) Close() {
	for _, id := range d.networkIDs() {
		n := d.lockNetwork(id)
		if n == nil {
			continue
		}
		d.removeNetwork(n)
		n.mu.Unlock()
	}
}

// refuseUnencryptable records and logs the refusal of an encrypted
// network when this host cannot encrypt, and returns it.
func (d *Driver) refuseUnencryptable(id string) error {
	err := d.encryptionReady()
	if err != nil {
		d.refused.record(id, err, time.Now())
		d.log.Error("encrypted network refused", "why", "its tasks fail on this host", "network", id, "err", err)
	}
	return err
}

// removeNetwork takes n out of the table if it is still there, and ends
// its loop. Caller holds n.mu.
func (d *Driver) removeNetwork(n *network) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.networks[n.id] == n {
		delete(d.networks, n.id)
		close(n.gone)
	}
}

// encryptionReady says why encrypted networks cannot be served here.
func (d *Driver) encryptionReady() error {
	enc := d.encryption()
	if enc == nil {
		return fmt.Errorf("%w: encrypted networks need a cluster secret: start every plugin with --secret-file (OVERLAY_SECRET_FILE)", ErrInvalid)
	}
	if err := enc.Supported(); err != nil {
		return fmt.Errorf("%w: encrypted networks cannot work on this host: %v", ErrInvalid, err)
	}
	return nil
}

// validID accepts the ids Docker generates (hex, or swarm's base-36) and
// nothing that could escape a path or an interface name.
func validID(kind, id string) error {
	if err := peerdb.CheckID(kind, id); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}
