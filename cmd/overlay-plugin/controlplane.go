package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/netlinkxfrm"
	"github.com/overlay-plugin/overlay-plugin/enginewatch"
	"github.com/overlay-plugin/overlay-plugin/firewall"
)

// advertiseWait is how long the plugin waits for Docker to name this
// node's address (DiscoverNew, Self) before taking the default route's.
const advertiseWait = 10 * time.Second

// controlPlane is the gossip cluster and, with a cluster secret, the IPsec
// manager. Both start once this host's address is settled, which may be
// after the driver serves.
type controlPlane struct {
	cluster *cluster.Cluster
	enc     *encryption.Manager
	// stopRun ends the goroutines below (the key schedule and the keys'
	// storing, the swarm's nodes as gossip hints); runs counts them.
	stopRun context.CancelFunc
	runs    sync.WaitGroup
	release func()
}

// cpHolder publishes the control plane to the admin API once it exists.
type cpHolder struct{ p atomic.Pointer[controlPlane] }

func (h *cpHolder) get() *controlPlane { return h.p.Load() }

// startControlPlane settles this host's address and starts gossip and
// encryption. Without a gossip port it only settles the address. With an
// engine (else nil), the swarm's nodes are gossip hints.
func startControlPlane(ctx context.Context, cfg serveConfig, deps serveDeps, drv *driver.Driver, db *bbolt.DB, engine *dockerengine.Client,
	log *slog.Logger) (*controlPlane, error) {
	addr := cfg.AdvertiseAddr
	if !addr.IsValid() {
		var err error
		if addr, err = drv.AdvertiseAddr(ctx, deps.advertiseWait); err != nil {
			return nil, err
		}
	}
	drv.SetVTEP(addr)
	log.Info("advertise address settled", "addr", addr)
	if cfg.GossipPort == 0 {
		log.Warn("running without the gossip control plane (--gossip-port 0): remote endpoints only through the admin API")
		return &controlPlane{release: func() {}, stopRun: func() {}}, nil
	}
	var secret []byte
	if cfg.SecretFile != "" {
		var err error
		if secret, err = encryption.ReadSecret(cfg.SecretFile, log); err != nil {
			return nil, err
		}
	}
	name := cfg.NodeName
	if name == "" {
		host, _ := os.Hostname()
		name = host + "-" + addr.String()
	}
	cp := &controlPlane{release: func() {}, stopRun: func() {}}
	pub := encryption.NewPublisher(encryption.KeyStore{DB: db}, addr, log)
	// With a secret, gossip is encrypted and carries the IPsec public keys:
	// the publisher sends this host's, the manager receives the others'.
	var gossipKey []byte
	var nodeData func(netip.Addr, []byte)
	if secret != nil {
		resume := encryption.KeyStore{DB: db}.Resume(addr, log)
		x, fw, release, err := deps.newEncryption(cfg)
		if err != nil {
			return nil, fmt.Errorf("encryption: %w", err)
		}
		cp.release = release
		cp.enc, err = encryption.NewManager(encryption.Config{XFRM: x, Firewall: fw, Secret: encryption.Subkey(secret, encryption.UseESP),
			Local: addr, Port: cfg.VXLANPort, Schedule: encryption.ScheduleEvery(cfg.KeyRotation), Publish: pub.Publish, Logger: log,
			Resume: resume})
		if err != nil {
			release()
			return nil, err
		}
		gossipKey, nodeData = encryption.Subkey(secret, encryption.UseGossip), cp.enc.ReceiveKeys
	}
	c, err := cluster.New(cluster.Config{
		NodeName: name, BindPort: cfg.GossipPort, AdvertiseAddr: addr, Join: cfg.Join, SecretKey: gossipKey,
		DeadGrace: cfg.DeadGrace, RestartGrace: cfg.RestartGrace, Transport: deps.gossipTransport, Sink: drv, Logger: log,
		NodeData: nodeData,
	})
	if err != nil {
		if cp.enc != nil {
			cp.enc.Detach()
		}
		cp.release()
		return nil, fmt.Errorf("gossip: %w", err)
	}
	cp.cluster = c
	pub.Attach(c)
	runCtx, cancel := context.WithCancel(context.Background())
	cp.stopRun = cancel
	if cp.enc != nil {
		drv.SetEncryption(cp.enc)
		cp.runs.Go(func() { cp.enc.Run(runCtx, time.Second) })
		cp.runs.Go(func() { pub.Run(runCtx) })
	}
	if engine != nil {
		nodes := enginewatch.NewNodes(engine, c.NodeHint, 0, log)
		cp.runs.Go(func() { nodes.Run(runCtx) })
	}
	drv.SetControlPlane(c)
	log.Info("gossip control plane started", "node", name, "port", cfg.GossipPort, "seeds", cfg.Join, "encryption", cp.enc != nil)
	return cp, nil
}

// stopGossip stops deliveries into the driver; call before Driver.Close.
func (cp *controlPlane) stopGossip(log *slog.Logger) {
	cp.stopRun()
	cp.runs.Wait()
	if cp.cluster != nil {
		if err := cp.cluster.Close(); err != nil {
			log.Warn("stop gossip", "err", err)
		}
	}
}

// stopEncryption leaves the IPsec state in the kernel for the sandboxes
// Driver.Close kept and the next run; call after Driver.Close.
func (cp *controlPlane) stopEncryption() {
	if cp.enc != nil {
		cp.enc.Detach()
	}
	cp.release()
}

// newNetlinkEncryption is the real xfrm and nftables side.
func newNetlinkEncryption(cfg serveConfig) (encryption.XFRM, encryption.Firewall, func(), error) {
	x, err := netlinkxfrm.New(netns.None())
	if err != nil {
		return nil, nil, nil, err
	}
	return x, firewall.New(nil, cfg.VXLANPort, encryption.Mark), func() { x.Close() }, nil
}
