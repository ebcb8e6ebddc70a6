package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/overlay-plugin/overlay-plugin/check"
	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/controlplane"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/metrics"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/pluginapi"
	"github.com/overlay-plugin/overlay-plugin/vxlanfilter"
)

// gate admits the calls of both APIs to the driver (pluginapi.Gate).
type gate = pluginapi.Gate[*driver.Driver]

// adminBackend is the admin API's view: the driver through the gate, plus
// the control plane once it runs. gossip says the control plane is
// configured: it then owns the remote peers, and its next sync would
// remove one added by hand, so the hand's writes are refused.
type adminBackend struct {
	g      *gate
	plane  *atomic.Pointer[controlplane.Plane]
	gossip bool
}

// errGossipOwnsPeers refuses peer add/del while gossip runs.
var errGossipOwnsPeers = fmt.Errorf("%w: remote peers come from the gossip control plane on this host, which would undo a change made by hand; run with --gossip-port 0 to manage peers with 'overlay-plugin peer'", driver.ErrConflict)

func (b adminBackend) State() []driver.NetworkState {
	s, err := pluginapi.Call(b.g, "State", nil, func(d *driver.Driver) ([]driver.NetworkState, error) { return d.State(), nil })
	if err != nil {
		return nil
	}
	return s
}

func (b adminBackend) AddPeer(nid string, p peerdb.Peer) error {
	if b.gossip {
		return errGossipOwnsPeers
	}
	return pluginapi.Call0(b.g, "AddPeer", []any{"network", nid, "endpoint", p.EndpointID}, func(d *driver.Driver) error { return d.AddPeer(nid, p) })
}

func (b adminBackend) DeletePeer(nid, eid string) error {
	if b.gossip {
		return errGossipOwnsPeers
	}
	return pluginapi.Call0(b.g, "DeletePeer", []any{"network", nid, "endpoint", eid}, func(d *driver.Driver) error { return d.DeletePeer(nid, eid) })
}

func (b adminBackend) Cluster() (any, error)    { return b.plane.Load().Cluster() }
func (b adminBackend) Encryption() (any, error) { return b.plane.Load().Encryption() }
func (b adminBackend) RotateKeys() error        { return b.plane.Load().RotateKeys() }
func (b adminBackend) ReloadSecrets(ctx context.Context) error {
	return b.plane.Load().Reload(ctx)
}

// Check gathers the check's inputs from the driver and the control plane.
func (b adminBackend) Check() (any, error) {
	in := check.Inputs{Now: time.Now()}
	if d, ok := b.g.Driver(); ok {
		d.CheckInputs(&in)
	}
	b.plane.Load().CheckInputs(&in)
	return check.Build(in), nil
}

// metricsSources reads the driver once it is ready and, once it runs, the
// control plane.
func metricsSources(g *gate, plane *atomic.Pointer[controlplane.Plane], filter sourceFilter) metrics.Sources {
	var vxlanFilter func() (vxlanfilter.Status, bool)
	if filter != nil {
		vxlanFilter = func() (vxlanfilter.Status, bool) {
			st, err := filter.Status()
			return st, err == nil
		}
	}
	return metrics.Sources{
		VXLANFilter: vxlanFilter,
		Networks: func() []driver.NetworkStats {
			if d, ok := g.Driver(); ok {
				return d.Stats()
			}
			return nil
		},
		Repairs: func() map[string]uint64 {
			if d, ok := g.Driver(); ok {
				return d.Repairs()
			}
			return nil
		},
		MACConflicts: func() uint64 {
			if d, ok := g.Driver(); ok {
				return d.MACConflicts()
			}
			return 0
		},
		Cluster:    func() (cluster.Stats, bool) { return plane.Load().ClusterStats() },
		Secrets:    func() (encryption.SecretsStatus, bool) { return plane.Load().SecretsStatus() },
		Encryption: func() (encryption.Status, bool) { return plane.Load().EncryptionStatus() },
		Paths:      func() []health.PathStatus { return plane.Load().Paths() },
		Version:    version, Commit: commit,
	}
}
