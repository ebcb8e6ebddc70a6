package main

import (
	"fmt"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/metrics"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/pluginapi"
)

// gate admits the calls of both APIs to the driver (pluginapi.Gate).
type gate = pluginapi.Gate[*driver.Driver]

// adminBackend is the admin API's view: the driver through the gate, plus
// the control plane once it runs.
type adminBackend struct {
	g  *gate
	cp *cpHolder
}

func (b adminBackend) State() []driver.NetworkState {
	s, err := pluginapi.Call(b.g, "State", nil, func(d *driver.Driver) ([]driver.NetworkState, error) { return d.State(), nil })
	if err != nil {
		return nil
	}
	return s
}

func (b adminBackend) AddPeer(nid string, p peerdb.Peer) error {
	return pluginapi.Call0(b.g, "AddPeer", []any{"network", nid, "endpoint", p.EndpointID}, func(d *driver.Driver) error { return d.AddPeer(nid, p) })
}

func (b adminBackend) DeletePeer(nid, eid string) error {
	return pluginapi.Call0(b.g, "DeletePeer", []any{"network", nid, "endpoint", eid}, func(d *driver.Driver) error { return d.DeletePeer(nid, eid) })
}

var errNoGossip = fmt.Errorf("%w: the gossip control plane is not running (--gossip-port 0, or still starting)", driver.ErrNotFound)

func (b adminBackend) Cluster() (any, error) {
	cp := b.cp.get()
	if cp == nil || cp.cluster == nil {
		return nil, errNoGossip
	}
	return struct {
		Members []cluster.Member `json:"members"`
		Stats   cluster.Stats    `json:"stats"`
	}{cp.cluster.Members(), cp.cluster.Stats()}, nil
}

var errNoEncryption = fmt.Errorf("%w: encryption is not running (no --secret-file, or still starting)", driver.ErrNotFound)

func (b adminBackend) Encryption() (any, error) {
	cp := b.cp.get()
	if cp == nil || cp.enc == nil {
		return nil, errNoEncryption
	}
	return cp.enc.Status(), nil
}

func (b adminBackend) RotateKeys() error {
	cp := b.cp.get()
	if cp == nil || cp.enc == nil {
		return errNoEncryption
	}
	return cp.enc.Rotate()
}

// metricsSources reads the driver once it is ready and, once it runs, the
// control plane.
func metricsSources(g *gate, cps *cpHolder) metrics.Sources {
	return metrics.Sources{
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
		Cluster: func() (cluster.Stats, bool) {
			if cp := cps.get(); cp != nil && cp.cluster != nil {
				return cp.cluster.Stats(), true
			}
			return cluster.Stats{}, false
		},
		Encryption: func() (encryption.Status, bool) {
			if cp := cps.get(); cp != nil && cp.enc != nil {
				return cp.enc.Status(), true
			}
			return encryption.Status{}, false
		},
		Version: version, Commit: commit,
	}
}
