package driver

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

// VXLAN encapsulation overhead: outer IP + UDP + VXLAN + inner Ethernet.
const (
	overheadIPv4 = 20 + 8 + 8 + 14
	overheadIPv6 = 40 + 8 + 8 + 14
)

// network is one overlay network on this host.
type network struct {
	// id and vni are set at creation and never change: read without mu.
	id  string
	vni uint32
	// kick (capacity 1) asks the network's reconciler loop for a pass;
	// gone is closed when the network leaves the table (removeNetwork).
	// Both are set at creation and never change.
	kick, gone chan struct{}
	// looping: a loop runs for this network. Guarded by Driver.mu.
	looping bool

	// mu guards every field below and the kernel state of the network's
	// sandbox. Top of the lock order: taken before Driver.mu, never while
	// holding Driver.mu or another network's mu.
	mu lockrank.Mutex[lockrank.Network]

	opts    netOptions
	subnets []netip.Prefix
	// gateways are the pools' gateways, which no endpoint may claim
	// (validate.go).
	gateways []netip.Addr

	// endpoints are the local endpoints by id, and byMAC the same by MAC
	// (a local MAC is unique: localClash, checkRecovered). Changed only
	// by addLocal and dropLocal, which keep the two in step.
	endpoints map[string]*endpoint
	byMAC     map[hwaddr.MAC]*endpoint
	// peers holds every endpoint of the network, local ones marked Local;
	// its bindings are the desired neighbour entries.
	peers peerdb.DB
	// planner keeps the books of the sandbox's entries: the FDB reference
	// counts and the remote VTEPs' IPsec references (planner.go).
	planner planner
	// sandbox is the kernel sandbox's name, empty while no local endpoint
	// is joined.
	sandbox string
	mtu     int
	joined  int
	// guarded: the encryption side guards this encrypted network's VNI
	// for its sandbox (EnableVNI). False for a sandbox adopted from the
	// previous run until SetEncryption settles it; its peers wait.
	guarded bool
	// unrecorded: taken over from the kernel without a record, so its
	// subnets and options are unknown until Docker creates it again.
	unrecorded bool
	// partial: the plugin's record of the network's endpoints may be
	// incomplete (adopted, or an endpoint record was unreadable), so
	// Docker's calls for endpoints it does not know succeed.
	partial bool
	// strays are sandbox ends of veths attached to containers of no known
	// endpoint (restore.go); each counts in joined.
	strays map[string]bool
	// services are the network's service VIPs as Docker lists them, and
	// svcEndpoints the endpoints of their tasks (services.go).
	services     []Service
	svcEndpoints map[string]bool
	// adopted: the sandbox is the previous run's and the remote
	// endpoints are not settled yet (see reconcile). reconcileErr is the
	// outcome of the last reconcile, for State.
	adopted      bool
	reconcileErr error
}

func (d *Driver) GetCapabilities() (*api.CapabilitiesResponse, error) {
	return &api.CapabilitiesResponse{Scope: api.GlobalScope, ConnectivityScope: api.GlobalScope}, nil
}

// AllocateNetwork runs on the swarm leader. It reserves the network's VNI
// (the user's choice, or the next free one) and returns the user's options
// plus the VNI; Docker hands exactly these to every node's CreateNetwork. A
// new leader calls it again with the options returned before, which
// re-reserves the same VNI.
func (d *Driver) AllocateNetwork(req *api.AllocateNetworkRequest) (*api.AllocateNetworkResponse, error) {
	if err := validID("network", req.NetworkID); err != nil {
		return nil, err
	}
	opts, err := parseOptions(req.Options)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	// An encrypted network is allocated even if this host cannot encrypt:
	// each host that cannot refuses it in CreateNetwork, where Docker shows
	// the reason on the failed task; a refusal here would leave every task
	// in "New" with the reason only in this manager's log.
	id := opts.vni
	if id != 0 {
		if err := d.vnis.Reserve(req.NetworkID, id); err != nil {
			return nil, err
		}
	} else if id, err = d.vnis.Allocate(req.NetworkID); err != nil {
		return nil, err
	}
	out := maps.Clone(req.Options)
	if out == nil {
		out = map[string]string{}
	}
	delete(out, optVNIAlias)
	out[OptVNI] = strconv.FormatUint(uint64(id), 10)
	d.lowerMTU(req.NetworkID, opts, out)
	d.log.Info("allocated network", "network", req.NetworkID, "vni", id)
	return &api.AllocateNetworkResponse{Options: out}, nil
}

// FreeNetwork releases the network's VNI on the leader.
func (d *Driver) FreeNetwork(req *api.FreeNetworkRequest) error {
	if err := validID("network", req.NetworkID); err != nil {
		return err
	}
	return d.vnis.Release(req.NetworkID)
}

// CreateNetwork records the network on this node. The sandbox is built
// lazily on the first local Join. Creating an id that exists is an error;
// one that is being deleted waits for the delete to finish.
func (d *Driver) CreateNetwork(req *api.CreateNetworkRequest) error {
	if err := validID("network", req.NetworkID); err != nil {
		return err
	}
	generic, err := genericOptions(req.Options)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	opts, err := parseOptions(generic)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if opts.vni == 0 {
		return fmt.Errorf("%w: network %s has no %s option: it must be created through the swarm (AllocateNetwork)", ErrInvalid, req.NetworkID, OptVNI)
	}
	if opts.encrypted {
		if err := d.refuseUnencryptable(req.NetworkID); err != nil {
			return err
		}
	}
	if opts.vni < vni.UserRange.Min || opts.vni > vni.UserRange.Max {
		return fmt.Errorf("%w: network %s: VNI %d is outside %d-%d (Docker's own overlay uses 4096 and up on the same port)",
			ErrInvalid, req.NetworkID, opts.vni, vni.UserRange.Min, vni.UserRange.Max)
	}
	subnets, gateways, err := poolsOf(req.IPv4Data, req.IPv6Data)
	if err != nil {
		return fmt.Errorf("%w: network %s: %v", ErrInvalid, req.NetworkID, err)
	}
	n := newNetwork(req.NetworkID, opts.vni, opts, subnets, gateways)
	for {
		if old := d.lockNetwork(n.id); old != nil {
			defer old.mu.Unlock()
			if old.unrecorded {
				return d.mergeAdopted(old, n)
			}
			return fmt.Errorf("%w: network %s exists already", ErrConflict, n.id)
		}
		// n is locked before it is published, so nobody sees it before it
		// is stored, and a failed store takes it out again. No other
		// network's lock is held here (lockrank: Network locks never nest).
		n.mu.Lock()
		d.mu.Lock()
		if _, taken := d.networks[n.id]; taken {
			// Created by someone else since lockNetwork looked: look again.
			d.mu.Unlock()
			n.mu.Unlock()
			continue
		}
		for _, other := range d.networks {
			if other.vni == n.vni {
				d.mu.Unlock()
				n.mu.Unlock()
				return fmt.Errorf("%w: VNI %d is used by network %s on this node", ErrConflict, n.vni, other.id)
			}
		}
		d.networks[n.id] = n
		d.mu.Unlock()
		break
	}
	defer n.mu.Unlock()
	if err := d.persistNewNetwork(n); err != nil {
		return err
	}
	d.refused.take(n.id)
	d.startLoop(n)
	if cp := d.controlPlane(); cp != nil {
		cp.NetworkAdded(n.id)
	}
	d.log.Info("created network", "network", n.id, "vni", n.vni, "subnets", subnets, "flood", opts.flood)
	return nil
}

// DeleteNetwork removes the network and its sandbox. If the sandbox cannot
// be removed the network stays, so that the delete can be retried. A
// network this host refused has neither: deleting it succeeds, so that
// `docker network rm` does, and forgets the refusal.
func (d *Driver) DeleteNetwork(req *api.DeleteNetworkRequest) error {
	n, err := d.mustLockNetwork(req.NetworkID)
	if errors.Is(err, ErrNotFound) && d.refused.take(req.NetworkID) {
		d.log.Info("deleted refused network", "network", req.NetworkID)
		return nil
	}
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	if err := d.teardownSandbox(n); err != nil {
		return err
	}
	if err := d.store.deleteNetwork(n.id); err != nil {
		d.log.Warn("forget stored network", "network", n.id, "err", err)
	}
	// Still the instance we locked: lockNetwork guarantees it, and only a
	// holder of n.mu removes n.
	d.removeNetwork(n)
	d.refused.take(n.id)
	if cp := d.controlPlane(); cp != nil {
		cp.NetworkRemoved(n.id)
	}
	d.log.Info("deleted network", "network", n.id)
	return nil
}

// persistNewNetwork stores a network just put in the table; on failure it
// takes it out again, re-checking that the table still holds this
// instance. Caller holds n.mu.
func (d *Driver) persistNewNetwork(n *network) error {
	err := d.store.putNetwork(n)
	if err == nil {
		return nil
	}
	d.removeNetwork(n)
	return fmt.Errorf("network %s: %w", n.id, err)
}

// ensureSandbox builds the network's sandbox if it has none and programs
// every remote binding the peer db holds. Caller holds n.mu.
func (d *Driver) ensureSandbox(n *network) error {
	if n.sandbox != "" {
		return nil
	}
	var enc Encryption
	if n.opts.encrypted {
		if err := d.refuseUnencryptable(n.id); err != nil {
			return err
		}
		enc = d.encryption()
	}
	local, port, err := d.dataPath()
	if err != nil {
		return err
	}
	underMTU, mtu, err := d.overlayMTU(local, enc)
	if err != nil {
		return err
	}
	if n.opts.mtu != 0 && n.opts.mtu < mtu {
		mtu = n.opts.mtu
	}
	if mtu < 1280 && slices.ContainsFunc(n.subnets, func(p netip.Prefix) bool { return p.Addr().Is6() }) {
		return fmt.Errorf("underlay MTU %d leaves %d for the overlay, below IPv6's minimum of 1280", underMTU, mtu)
	}
	// Filter the VNI before its VXLAN device exists; a filter the kernel
	// refused is retried by the periodic repair, as the device works on.
	if err := d.sources.AddVNI(n.vni); err != nil {
		d.log.Warn("VXLAN source filter", "why", "the periodic repair retries", "network", n.id, "vni", n.vni, "err", err)
	}
	if enc != nil {
		// Guard the VNI before its VXLAN device exists.
		if err := enc.EnableVNI(n.vni); err != nil {
			d.dropSourceVNI(n)
			return fmt.Errorf("network %s: %w", n.id, err)
		}
		n.guarded = true
	}
	spec := kernel.SandboxSpec{Name: n.id, VNI: n.vni, Port: port, Local: local, MTU: mtu}
	if err := d.kernel.CreateSandbox(spec); err != nil {
		if enc != nil {
			if derr := enc.DisableVNI(n.vni); derr != nil {
				d.log.Warn("undo firewall rules", "network", n.id, "err", derr)
			}
			n.guarded = false
		}
		d.dropSourceVNI(n)
		return fmt.Errorf("create sandbox for network %s: %w", n.id, err)
	}
	n.sandbox, n.mtu, n.adopted = n.id, mtu, false
	n.planner.Reset() // holds nothing without a sandbox
	if err := d.store.putNetwork(n); err != nil {
		d.log.Warn("persist network", "network", n.id, "err", err)
	}
	if cp := d.controlPlane(); cp != nil {
		d.syncRemotePeers(n, cp.Snapshot(n.id))
	}
	// Programming every peer is a reconcile of the empty sandbox; its
	// loop then watches the sandbox.
	entries, err := d.fillSandbox(n)
	if err != nil {
		d.log.Warn("program new sandbox", "network", n.id, "err", err)
	}
	n.kickLoop()
	d.log.Info("created sandbox", "network", n.id, "vni", n.vni, "vtep", local, "mtu", mtu, "entries", entries)
	return nil
}

// teardownSandbox removes the sandbox, if any, with every veth in it. The
// endpoints stay, unjoined. Caller holds n.mu.
func (d *Driver) teardownSandbox(n *network) error {
	if n.sandbox == "" {
		return nil
	}
	if err := d.kernel.DeleteSandbox(n.sandbox); err != nil && !errors.Is(err, kernel.ErrNotFound) {
		return fmt.Errorf("delete sandbox of network %s: %w", n.id, err)
	}
	cp := d.controlPlane()
	for _, ep := range n.endpoints {
		if ep.joined {
			d.unbalance(n, ep)
			ep.joined = false
			ep.sandboxKey, ep.balanced = "", ""
			n.peers.Delete(ep.id)
			if cp != nil {
				cp.Retract(n.id, ep.id)
			}
			if err := d.store.putEndpoint(n.id, ep); err != nil {
				d.log.Warn("persist endpoint", "endpoint", ep.id, "err", err)
			}
		}
	}
	released := n.planner.Reset()
	if n.opts.encrypted && n.guarded {
		for _, vtep := range released {
			if err := d.encryption().RemoveRemote(vtep); err != nil {
				d.log.Warn("release IPsec state", "network", n.id, "remote", vtep, "err", err)
			}
		}
		if err := d.encryption().DisableVNI(n.vni); err != nil {
			d.log.Warn("remove firewall rules", "network", n.id, "err", err)
		}
	}
	for _, vtep := range released {
		if err := d.sources.RemoveRemote(vtep); err != nil {
			d.log.Warn("VXLAN source filter", "network", n.id, "remote", vtep, "err", err)
		}
	}
	d.dropSourceVNI(n)
	n.sandbox, n.joined, n.mtu, n.guarded, n.adopted, n.reconcileErr, n.strays = "", 0, 0, false, false, nil, nil
	n.kickLoop() // to stop watching it
	if err := d.store.putNetwork(n); err != nil {
		d.log.Warn("persist network", "network", n.id, "err", err)
	}
	d.log.Info("removed sandbox", "network", n.id)
	return nil
}

// apply programs a batch of ownership changes: the planner turns them
// into work without reading the kernel, whose entries go in one Program
// call, pipelined, and each entry's failure is reported (and kicks the
// reconciler, reconcile.go, which compares the whole). The peer db is
// updated whether or not the kernel accepted a change, so it stays the
// desired state. Caller holds n.mu.
func (d *Driver) apply(n *network, changes []peerdb.Change) error {
	if n.sandbox == "" || (n.opts.encrypted && !n.guarded) || len(changes) == 0 {
		return nil
	}
	if err := d.execute(n, n.planner.Apply(changes, n.opts.flood)); err != nil {
		n.kickLoop() // the reconciler repairs what failed
		return fmt.Errorf("program peers of network %s: %w", n.id, err)
	}
	return nil
}

// execute runs a planner's work in its one order, for both the fast path
// (apply) and the reconciler: the source filter's references of the
// remote VTEPs that appear are taken, and their IPsec references
// (encrypted networks), the entries are written, then the references of
// the VTEPs that went are dropped. So a remote host is admitted before
// this one sends to it, and sends back. A failure of
// one step does not stop the next: the planner's books already say the
// work is done, and the reconciler repairs the kernel. Caller holds n.mu.
func (d *Driver) execute(n *network, w work) error {
	var errs []error
	for _, vtep := range w.take {
		errs = append(errs, d.sources.AddRemote(vtep))
		if n.opts.encrypted {
			errs = append(errs, d.encryption().AddRemote(vtep))
		}
	}
	errs = append(errs, d.program(n, w.ops))
	for _, vtep := range w.release {
		if n.opts.encrypted {
			errs = append(errs, d.encryption().RemoveRemote(vtep))
		}
		errs = append(errs, d.sources.RemoveRemote(vtep))
	}
	return errors.Join(errs...)
}

// dropSourceVNI stops filtering n's VNI, its sandbox gone or never made.
// Caller holds n.mu.
func (d *Driver) dropSourceVNI(n *network) {
	if err := d.sources.RemoveVNI(n.vni); err != nil {
		d.log.Warn("VXLAN source filter", "network", n.id, "vni", n.vni, "err", err)
	}
}

// program sends ops to n's sandbox in one batch, in order. Deleting what
// is already gone is not an error. Caller holds n.mu.
func (d *Driver) program(n *network, ops []kernel.EntryOp) error {
	var errs []error
	for i, err := range d.kernel.Program(n.sandbox, ops) {
		if err != nil && !(isDelete(ops[i].Kind) && errors.Is(err, kernel.ErrNotFound)) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func isDelete(k kernel.EntryOpKind) bool {
	return k == kernel.OpDeleteNeighbor || k == kernel.OpDeleteFDB
}

// poolsOf parses the IPAM pools Docker assigned to the network, and their
// gateways ("addr/len"; Docker leaves out a pool's gateway if it has none).
func poolsOf(v4, v6 []*api.IPAMData) ([]netip.Prefix, []netip.Addr, error) {
	var pools []netip.Prefix
	var gateways []netip.Addr
	for _, list := range [][]*api.IPAMData{v4, v6} {
		for _, p := range list {
			if p == nil {
				return nil, nil, errors.New("null IPAM data")
			}
			pfx, err := netip.ParsePrefix(p.Pool)
			if err != nil {
				return nil, nil, fmt.Errorf("IPAM pool %q: %v", p.Pool, err)
			}
			pools = append(pools, pfx.Masked())
			if p.Gateway == "" {
				continue
			}
			gw, err := netip.ParsePrefix(p.Gateway)
			if err != nil {
				return nil, nil, fmt.Errorf("IPAM gateway %q: %v", p.Gateway, err)
			}
			gateways = append(gateways, gw.Addr().Unmap())
		}
	}
	return pools, gateways, nil
}
