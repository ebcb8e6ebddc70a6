package controlplane

import (
	"cmp"
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/health"
)

// healthSince is the first wire version whose nodes run a health
// endpoint: older ones (0.1.0) are not probed.
const healthSince = 3

// knownEvery bounds how often the prober's view of the members is
// rebuilt from the cluster's (a copy of every member).
const knownEvery = 3 * time.Second

// startHealth builds this host's health endpoints and runs the prober on
// the peers the driver programs, until ctx ends. Without a kernel for
// them, or when they cannot be built, the data path goes unprobed, and
// the log says why.
func (p *Plane) startHealth(ctx context.Context, cfg Config, drv *driver.Driver, addr netip.Addr, log *slog.Logger) {
	if cfg.Health == nil {
		return
	}
	log = log.With("component", "health")
	mtu, err := drv.OverlayMTU(false)
	if err != nil {
		log.Warn("data path probes unavailable", "err", err)
		return
	}
	ecfg := health.EndpointsConfig{Kernel: cfg.Health, Local: addr, VXLANPort: p.port, MTU: mtu, Log: log}
	if p.enc != nil && p.enc.Supported() == nil {
		ecfg.ESPMTU, ecfg.Guard = mtu-p.enc.Overhead(), p.enc
	}
	eps, err := health.OpenEndpoints(ecfg)
	if err != nil {
		log.Warn("data path probes unavailable", "err", err)
		return
	}
	p.endpoints = eps
	k := &knownCache{cluster: p.cluster}
	p.prober = health.New(health.Config{Conns: eps.Conns(), Port: health.EndpointPort, VXLANPort: p.port,
		Peers: func() []health.Peer { return peersOf(drv.RemoteVTEPs()) }, Sync: eps.Sync, Known: k.get, Interval: cfg.ProbeInterval, Log: log})
	p.runs.Go(func() { p.prober.Run(ctx) })
	log.Info("data path probes started", "esp", ecfg.ESPMTU > 0, "interval", cmp.Or(cfg.ProbeInterval, health.Interval))
}

func peersOf(rs []driver.RemoteVTEP) []health.Peer {
	out := make([]health.Peer, len(rs))
	for i, r := range rs {
		out[i] = health.Peer{VTEP: r.VTEP, MTU: r.MTU, ESPMTU: r.ESPMTU}
	}
	return out
}

// stopHealth removes the endpoints; call once the prober has stopped and
// before encryption stops (the ESP endpoint's VNI is guarded).
func (p *Plane) stopHealth() {
	if p.endpoints != nil {
		if err := p.endpoints.Close(); err != nil {
			p.log.Warn("remove health endpoints", "err", err)
		}
	}
}

// Paths is every probed path's state; nil while nothing is probed.
func (p *Plane) Paths() []health.PathStatus {
	if p == nil || p.prober == nil {
		return nil
	}
	return p.prober.Status()
}

// knownCache is what the members say of each VTEP, rebuilt at most every
// knownEvery. Only the prober's goroutine calls get.
type knownCache struct {
	cluster *cluster.Cluster
	at      time.Time
	m       map[netip.Addr]health.Known
}

func (k *knownCache) get() map[netip.Addr]health.Known {
	if k.cluster == nil {
		return nil
	}
	if now := time.Now(); now.Sub(k.at) >= knownEvery || k.m == nil {
		k.at, k.m = now, knownOf(k.cluster.Members())
	}
	return k.m
}

// knownOf reads the members: alive or not, and whether they run a
// release with a health endpoint. A member that has not advertised its
// wire versions yet counts as old until it has.
func knownOf(members []cluster.Member) map[netip.Addr]health.Known {
	m := make(map[netip.Addr]health.Known, len(members))
	for _, mb := range members {
		if mb.Self {
			continue
		}
		k := health.Known{Gossip: health.GossipDown, Old: wireHi(mb.Wire) < healthSince, VXLANPort: mb.Settings.VXLANPort}
		if mb.State == cluster.MemberAlive {
			k.Gossip = health.GossipAlive
		}
		m[mb.VTEP] = k
	}
	return m
}

// wireHi is the top of a member's wire range ("2..3"), 0 when unknown.
func wireHi(r string) int {
	_, hi, _ := strings.Cut(r, "..")
	n, _ := strconv.Atoi(hi)
	return n
}

// CheckInputs fills in what the control plane knows for the check:
// the probes, the gossip refused lately, the secret and ESP.
func (p *Plane) CheckInputs(in *check.Inputs) {
	if p == nil {
		return
	}
	in.Probing, in.Paths = p.prober != nil, p.Paths()
	if p.cluster != nil {
		in.Gossip = true
		in.Rejections = p.rejected.recent(counts(p.cluster.Stats()))
		esp := 0
		if p.enc != nil {
			esp = p.enc.Overhead()
		}
		in.Settings = mismatches(p.cluster.Members(), p.port, esp, p.drv.RemoteVTEPs())
	}
	in.SecretConfigured = p.secret
	if p.enc != nil {
		if err := p.enc.Supported(); err != nil {
			in.ESPUnsupported = err.Error()
		}
		in.EncryptionError = p.enc.Status().LastError
	}
}
