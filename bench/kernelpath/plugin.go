package kernelpath

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"

	api "github.com/docker/go-plugins-helpers/network"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

type underlay struct{}

func (underlay) DefaultAddr() (netip.Addr, error) { return netip.MustParseAddr(localVTEP), nil }
func (underlay) MTU(netip.Addr) (int, error)      { return 1500, nil }

// plugin is this repository's driver as `overlay-plugin serve` runs it:
// the netlink kernel, a state database, the reconciler (Run) watching
// every sandbox; peers arrive through AddPeers in batches, as the control
// plane delivers a burst.
type plugin struct {
	d     *driver.Driver
	k     *kernel.Netlink
	db    *bbolt.DB
	stop  context.CancelFunc
	done  chan struct{}
	batch int
	in    [][]peerdb.Peer
}

func newPlugin(stateDir string, batch int, reconciler bool) (*plugin, error) {
	k, err := kernel.NewNetlink(kernel.NetlinkConfig{SandboxDir: "/run/overlay-bench/sandboxes"})
	if err != nil {
		return nil, err
	}
	db, err := bbolt.Open(filepath.Join(stateDir, "state.db"), 0o600, nil)
	if err != nil {
		return nil, err
	}
	alloc, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		return nil, err
	}
	d, err := driver.New(driver.Config{Kernel: k, Underlay: underlay{}, VNIs: alloc, DB: db,
		AdvertiseAddr: netip.MustParseAddr(localVTEP), VXLANPort: 4789,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &plugin{d: d, k: k, db: db, stop: cancel, done: make(chan struct{}), batch: batch}
	if reconciler {
		go func() { d.Run(ctx); close(p.done) }()
	} else {
		close(p.done)
	}
	return p, nil
}

func (p *plugin) createNetwork(k int) error {
	return p.d.CreateNetwork(&api.CreateNetworkRequest{
		NetworkID: netID(k),
		Options:   map[string]any{"com.docker.network.generic": map[string]any{driver.OptVNI: fmt.Sprint(vniOf(k))}},
		IPv4Data:  []*api.IPAMData{{Pool: subnet(k).String(), Gateway: netip.PrefixFrom(gateway(k), 16).String()}},
	})
}

// join creates and joins network k's j-th local endpoint.
func (p *plugin) join(k, j int) error {
	eid := localID(k, j)
	_, err := p.d.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: netID(k), EndpointID: eid,
		Interface: &api.EndpointInterface{Address: netip.PrefixFrom(localAddr(k, j), 16).String()}})
	if err != nil {
		return err
	}
	_, err = p.d.Join(&api.JoinRequest{NetworkID: netID(k), EndpointID: eid, SandboxKey: fmt.Sprintf("/run/overlay-bench/c%d-%d", k, j)})
	return err
}

func (p *plugin) leave(k, j int) error {
	eid := localID(k, j)
	if err := p.d.Leave(&api.LeaveRequest{NetworkID: netID(k), EndpointID: eid}); err != nil {
		return err
	}
	return p.d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: netID(k), EndpointID: eid})
}

func (p *plugin) setup(networks int) error {
	for k := range networks {
		if err := p.createNetwork(k); err != nil {
			return err
		}
		if err := p.join(k, 0); err != nil {
			return err
		}
	}
	return nil
}

func (p *plugin) prepare(k int, peers []peer) error {
	in := make([]peerdb.Peer, len(peers))
	for i, q := range peers {
		in[i] = peerdb.Peer{EndpointID: q.id, IPs: []netip.Addr{q.ip}, MAC: q.mac, VTEP: q.vtep}
	}
	p.in = append(p.in, in)
	return nil
}

func (p *plugin) program(k int) error {
	in := p.in[k]
	for len(in) > 0 {
		n := min(p.batch, len(in))
		if err := p.d.AddPeers(netID(k), in[:n]); err != nil {
			return err
		}
		in = in[n:]
	}
	return nil
}

func (p *plugin) count(k int) (neigh, fdb int, err error) {
	ns, err := p.k.Neighbors(netID(k))
	if err != nil {
		return 0, 0, err
	}
	fs, err := p.k.FDB(netID(k))
	if err != nil {
		return 0, 0, err
	}
	for _, n := range ns {
		if !n.NotPermanent {
			neigh++
		}
	}
	for _, f := range fs {
		if !f.NotPermanent {
			fdb++
		}
	}
	return neigh, fdb, nil
}

func (p *plugin) close() {
	p.stop()
	<-p.done
	p.d.Close()
	p.k.Close()
	p.db.Close()
}
