package health

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// The endpoints' VXLAN identifiers sit at the top of the 24-bit range,
// far from this plugin's (1–4095) and from Docker's overlay, which
// allocates from 4096 upward.
const (
	VNIPlain = 1<<24 - 2
	VNIESP   = 1<<24 - 3
	// EndpointPort is the endpoints' UDP port inside their sandboxes.
	EndpointPort = 4799
	// resyncEvery: all entries are written again this often, which
	// repairs what someone removed.
	resyncEvery = time.Minute
)

// Kernel is what the endpoints need of the kernel (kernel.Netlink, on a
// sandbox directory of their own).
type Kernel interface {
	CreateSandbox(kernel.SandboxSpec) error
	DeleteSandbox(name string) error
	Sandboxes() ([]string, error)
	Program(sandbox string, ops []kernel.EntryOp) []error
	OpenEndpoint(sandbox string, mac hwaddr.MAC, addr netip.Addr, port uint16) (*net.UDPConn, error)
}

// Guard marks and guards a VNI's VXLAN for IPsec, as an encrypted
// network's (the encryption manager).
type Guard interface {
	EnableVNI(vni uint32) error
	DisableVNI(vni uint32) error
}

// EndpointsConfig says where and how to build the endpoints.
type EndpointsConfig struct {
	Kernel Kernel
	// Local is this host's VTEP, VXLANPort its VXLAN port.
	Local     netip.Addr
	VXLANPort uint16
	// MTU is the plain path's, ESPMTU the encrypted one's; 0: no ESP path.
	MTU, ESPMTU int
	// Guard is required with ESPMTU.
	Guard Guard
	Log   *slog.Logger
}

// Endpoints are this host's health endpoints: a sandbox per path whose
// bridge answers probes, and their entries for every peer. Sync is called
// from one goroutine at a time (the prober's).
type Endpoints struct {
	cfg   EndpointsConfig
	conns map[Path]Conn
	// programmed are the peers whose entries are in both sandboxes;
	// guarded says VNIESP is guarded (while some peer has an ESP path).
	programmed map[netip.Addr]bool
	guarded    bool
	resynced   time.Time
}

// MAC is the MAC of a host's endpoint, derived from its VTEP so that
// peers need not learn it: locally administered, unicast.
func MAC(vtep netip.Addr) hwaddr.MAC {
	m := hwaddr.MAC{0x02, 'H'}
	if vtep.Is4() {
		copy(m[2:], vtep.AsSlice())
	} else {
		sum := sha256.Sum256(vtep.AsSlice())
		copy(m[2:], sum[:4])
	}
	return m
}

func sandboxOf(p Path) string { return string(p) }

// OpenEndpoints removes the endpoints a previous run left and builds
// them anew.
func OpenEndpoints(cfg EndpointsConfig) (*Endpoints, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	e := &Endpoints{cfg: cfg, conns: map[Path]Conn{}, programmed: map[netip.Addr]bool{}}
	old, err := cfg.Kernel.Sandboxes()
	if err != nil {
		return nil, fmt.Errorf("health endpoints: %w", err)
	}
	for _, name := range old {
		if err := cfg.Kernel.DeleteSandbox(name); err != nil {
			return nil, fmt.Errorf("health endpoints: remove the previous run's: %w", err)
		}
	}
	paths := map[Path]struct {
		vni uint32
		mtu int
	}{PathVXLAN: {VNIPlain, cfg.MTU}}
	if cfg.ESPMTU > 0 {
		paths[PathESP] = struct {
			vni uint32
			mtu int
		}{VNIESP, cfg.ESPMTU}
	}
	for path, p := range paths {
		name := sandboxOf(path)
		spec := kernel.SandboxSpec{Name: name, VNI: p.vni, Port: cfg.VXLANPort, Local: cfg.Local, MTU: p.mtu}
		if err := cfg.Kernel.CreateSandbox(spec); err != nil {
			e.Close()
			return nil, fmt.Errorf("health endpoints: %w", err)
		}
		c, err := cfg.Kernel.OpenEndpoint(name, MAC(cfg.Local), cfg.Local, EndpointPort)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("health endpoints: %w", err)
		}
		e.conns[path] = c
	}
	return e, nil
}

// Conns are the endpoints' sockets, for the prober (which closes them).
func (e *Endpoints) Conns() map[Path]Conn { return e.conns }

// Sync programs every peer's entries into the endpoints' sandboxes and
// removes those of peers gone, and guards VNIESP while some peer has an
// ESP path (before its first ESP probe). A failure is logged and retried
// at the next Sync.
func (e *Endpoints) Sync(peers []Peer) {
	now := time.Now()
	full := now.Sub(e.resynced) >= resyncEvery
	if full {
		e.resynced = now
	}
	want := map[netip.Addr]bool{}
	esp := false
	for _, p := range peers {
		want[p.VTEP] = true
		esp = esp || p.ESPMTU > 0
	}
	if _, ok := e.conns[PathESP]; ok && esp != e.guarded {
		set := e.cfg.Guard.DisableVNI
		if esp {
			set = e.cfg.Guard.EnableVNI
		}
		if err := set(VNIESP); err != nil {
			e.cfg.Log.Warn("guard health endpoint", "vni", VNIESP, "err", err)
		} else {
			e.guarded = esp
		}
	}
	var ops []kernel.EntryOp
	var vteps []netip.Addr
	for v := range want {
		if !e.programmed[v] || full {
			ops = append(ops,
				kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: v, MAC: MAC(v)}},
				kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: MAC(v), VTEP: v}})
			vteps = append(vteps, v, v)
		}
	}
	for v := range e.programmed {
		if !want[v] {
			ops = append(ops,
				kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: v}},
				kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: kernel.FDBEntry{MAC: MAC(v), VTEP: v}})
			vteps = append(vteps, v, v)
			delete(e.programmed, v)
		}
	}
	if len(ops) == 0 {
		return
	}
	failed := map[netip.Addr]error{}
	for path := range e.conns {
		for i, err := range e.cfg.Kernel.Program(sandboxOf(path), ops) {
			if err != nil {
				failed[vteps[i]] = err
			}
		}
	}
	for i := 0; i < len(ops); i += 2 {
		v := vteps[i]
		if ops[i].Kind == kernel.OpSetNeighbor {
			e.programmed[v] = failed[v] == nil
		}
	}
	if len(failed) > 0 {
		e.cfg.Log.Warn("program health endpoints", "peers", len(failed), "err", first(failed))
		e.resynced = time.Time{}
	}
}

func first(m map[netip.Addr]error) error {
	for _, err := range m {
		return err
	}
	return nil
}

// Close removes the endpoints and their guard.
func (e *Endpoints) Close() error {
	var errs []error
	if e.guarded {
		errs = append(errs, e.cfg.Guard.DisableVNI(VNIESP))
		e.guarded = false
	}
	for _, p := range []Path{PathVXLAN, PathESP} {
		if err := e.cfg.Kernel.DeleteSandbox(sandboxOf(p)); err != nil && !errors.Is(err, kernel.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
