// Package controlplane connects this host to the others once its address
// is settled: the gossip cluster and, with a cluster secret, the IPsec
// manager, whose public keys the gossip carries both ways (the publisher
// sends this host's, the manager receives the others'). The plugin starts
// it after the driver serves, since Docker names this node's address just
// after the plugin starts.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/enginewatch"
	"github.com/overlay-plugin/overlay-plugin/health"
)

// Config is what Start needs, from the plugin's settings.
type Config struct {
	// Addr is this host's VTEP; zero: the address Docker names within
	// AdvertiseWait, else the default route's (Driver.AdvertiseAddr).
	Addr          netip.Addr
	AdvertiseWait time.Duration
	// GossipPort 0 runs without gossip: Start only settles the address.
	GossipPort   int
	Join         []string
	NodeName     string // empty: <hostname>-<address>
	SecretFile   string // empty: no encryption, gossip in clear
	DeadGrace    time.Duration
	RestartGrace time.Duration
	KeyRotation  time.Duration
	// Port is the VXLAN port as StartPort chose it; a zero Port is
	// settled here, once the members can tell theirs (vxlanport.go).
	Port PortChoice
	// Transport, if set, replaces memberlist's network transport.
	Transport memberlist.Transport
	// NewEncryption builds the xfrm and firewall side of encryption for
	// VXLAN on port; the func it returns releases them.
	NewEncryption func(port uint16) (encryption.XFRM, encryption.Firewall, func(), error)
	// DB keeps the published keys for the next run.
	DB *bbolt.DB
	// Engine, if set, names the swarm's nodes as gossip hints.
	Engine *dockerengine.Client
	// Health, if set, holds the data-path probes' endpoints (a kernel on
	// a sandbox directory of their own); nil: the data path is not
	// probed.
	Health health.Kernel
	// ProbeInterval is the probes' interval (health.Interval when 0).
	ProbeInterval time.Duration
	// MemberVTEPs, if set, receives the live members' VTEPs (see
	// cluster.Config): the VXLAN source filter admits them.
	MemberVTEPs func([]netip.Addr)
	Logger      *slog.Logger
}

// Plane is a started control plane. A nil *Plane is one not (yet)
// running: its inspection methods say so.
type Plane struct {
	cluster *cluster.Cluster
	enc     *encryption.Manager
	log     *slog.Logger
	// stopRun ends the goroutines below (the key schedule and the keys'
	// storing, the swarm's nodes as gossip hints); runs counts them.
	stopRun context.CancelFunc
	runs    sync.WaitGroup
	release func()
	// endpoints and prober probe the data path (health.go); nil when not.
	endpoints *health.Endpoints
	prober    *health.Prober
	// secret: a cluster secret is configured; rejected samples the
	// gossip refused lately (rejections.go).
	secret   bool
	rejected rejections
	// secrets follows the secret file; nil without one.
	secrets *secretFile
	// drv and port are for the settings agreement (agreement.go).
	drv  *driver.Driver
	port uint16
}

// Start settles this host's address and starts gossip and encryption,
// connecting them to drv.
func Start(ctx context.Context, cfg Config, drv *driver.Driver) (*Plane, error) {
	log := cfg.Logger
	addr := cfg.Addr
	if !addr.IsValid() {
		var err error
		if addr, err = drv.AdvertiseAddr(ctx, cfg.AdvertiseWait); err != nil {
			return nil, err
		}
	}
	log.Info("advertise address settled", "addr", addr)
	runCtx, cancel := context.WithCancel(context.Background())
	p := &Plane{log: log, release: func() {}, stopRun: cancel, drv: drv}
	// The endpoints a lost state database forgot, from the engine, while
	// the rest starts; the gossip waits for them before it settles this
	// node's own records.
	var engine containerLister
	if cfg.Engine != nil {
		engine = cfg.Engine
	}
	recovered := make(chan struct{})
	p.runs.Go(func() {
		defer close(recovered)
		recoverEndpoints(runCtx, engine, drv, recoverWait, log)
	})
	// Docker's data-path port, which a first run follows when no member
	// says a port: asked before it settles. A known port (a restart, when
	// the engine may not listen yet) is settled at once, and compared
	// with Docker's in the background.
	var dp uint16
	var manager bool
	if cfg.Port.Port != 0 {
		p.settlePort(cfg, cfg.Port, addr)
		if cfg.Engine != nil {
			p.runs.Go(func() {
				dp, manager := enginewatch.DataPathPort(runCtx, cfg.Engine, log)
				enginewatch.WarnDataPathPort(cfg.Port.Port, dp, manager, log)
			})
		}
	} else if cfg.Engine != nil {
		dp, manager = enginewatch.DataPathPort(ctx, cfg.Engine, log)
	}
	firstRun := func(c clusterPort) PortChoice {
		pc := settleFirstRun(ctx, c, dp, manager, cfg.Engine != nil, log)
		p.settlePort(cfg, pc, addr)
		enginewatch.WarnDataPathPort(pc.Port, dp, manager, log)
		return pc
	}
	if cfg.GossipPort == 0 {
		log.Warn("gossip off", "why", "--gossip-port 0: remote endpoints only through the admin API")
		if cfg.Port.Port == 0 {
			firstRun(nil)
		}
		p.startHealth(runCtx, cfg, drv, addr, log)
		return p, nil
	}
	if cfg.SecretFile != "" {
		var err error
		if p.secrets, err = newSecretFile(cfg.SecretFile, log); err != nil {
			cancel()
			return nil, err
		}
	}
	name := cfg.NodeName
	if name == "" {
		host, _ := os.Hostname()
		name = host + "-" + addr.String()
	}
	var under int
	if u, err := drv.UnderlayMTU(addr); err != nil {
		log.Warn("settings not advertised", "why", "the underlay MTU is unknown", "err", err)
	} else {
		under = u
	}
	var settings cluster.Settings // told once they have a port
	if under != 0 {
		settings = settingsOf(cfg.Port, under)
	}
	// The IPsec manager needs the port. Known, it is built before the
	// join, as a restart needs: it takes over the previous run's IPsec
	// state before the members' records reach the driver. A first run
	// learns the port from the members, so it builds the manager after
	// the join, and the keys they publish meanwhile wait in keys.
	var keys relays
	ccfg := cluster.Config{
		NodeName: name, BindPort: cfg.GossipPort, AdvertiseAddr: addr, Join: cfg.Join,
		DeadGrace: cfg.DeadGrace, RestartGrace: cfg.RestartGrace, Transport: cfg.Transport, Sink: drv, Logger: log,
		MemberVTEPs: cfg.MemberVTEPs, Settings: settings, AwaitOwn: true,
	}
	pub := encryption.NewPublisher(encryption.KeyStore{DB: cfg.DB}, addr, log)
	if p.secrets != nil {
		ring := p.secrets.held()
		gk := gossipKeys(ring)
		ccfg.SecretKey, ccfg.AcceptKeys, ccfg.KeyIDs = gk[0], gk[1:], encryption.IDs(ring)
		ccfg.NodeData, ccfg.MemberKeyIDs = keys.public.deliver, keys.secrets.deliver
		if cfg.Port.Port != 0 {
			if err := p.newEncryption(cfg, addr, pub, &keys); err != nil {
				cancel()
				return nil, err
			}
		}
	}
	c, err := cluster.New(ccfg)
	if err != nil {
		cancel()
		p.StopEncryption()
		return nil, fmt.Errorf("gossip: %w", err)
	}
	p.cluster, p.secret = c, p.secrets != nil
	p.runs.Go(func() { p.rejected.run(runCtx, c) })
	if cfg.Engine != nil {
		nodes := enginewatch.NewNodes(cfg.Engine, c.NodeHint, 0, log)
		p.runs.Go(func() { nodes.Run(runCtx) })
	}
	// The leader's MTU for new networks counts this node's underlay from
	// the start, before its port is settled.
	drv.SetMTUFloor(func() (int, string) { return mtuFloor(c.Members()) })
	if cfg.Port.Port == 0 {
		pc := firstRun(c)
		if under != 0 {
			c.SettleSettings(settingsOf(pc, under))
		}
	}
	pub.Attach(c)
	if p.secrets != nil && p.enc == nil {
		if err := p.newEncryption(cfg, addr, pub, &keys); err != nil {
			p.StopGossip()
			return nil, err
		}
	}
	if p.enc != nil {
		drv.SetEncryption(p.enc)
		p.runs.Go(func() { p.enc.Run(runCtx, time.Second) })
		p.runs.Go(func() { pub.Run(runCtx) })
	}
	select {
	case <-recovered:
	case <-ctx.Done(): // stopping: what is recovered by now is published
	}
	drv.SetControlPlane(c) // republishes what the driver holds
	c.OwnSettled()
	if p.secrets != nil {
		p.runs.Go(func() { p.secrets.run(runCtx, p.applySecrets) })
	}
	p.startHealth(runCtx, cfg, drv, addr, log)
	log.Info("gossip control plane started", "node", name, "port", cfg.GossipPort, "seeds", cfg.Join, "encryption", p.enc != nil)
	return p, nil
}

// settlePort gives the driver its data path on pc's port, and stores a
// port chosen on a first run for the next.
func (p *Plane) settlePort(cfg Config, pc PortChoice, addr netip.Addr) {
	p.port = pc.Port
	p.drv.SetDataPath(addr, pc.Port)
	if cfg.Port.Port == 0 && cfg.DB != nil {
		if err := storePort(cfg.DB, pc); err != nil {
			p.log.Warn("VXLAN port not stored", "err", err, "why", "the next start settles it again")
		}
	}
	p.log.Info("VXLAN port settled", "port", pc.Port, "from", pc.Source, "follows_docker", pc.Swarm)
}

// newEncryption builds the IPsec manager for VXLAN on p.port, taking over
// the previous run's IPsec state, and hands it the keys the members
// published meanwhile (and from then on those they publish).
func (p *Plane) newEncryption(cfg Config, addr netip.Addr, pub *encryption.Publisher, keys *relays) error {
	resume := encryption.KeyStore{DB: cfg.DB}.Resume(addr, p.log)
	x, fw, release, err := cfg.NewEncryption(p.port)
	if err != nil {
		return fmt.Errorf("encryption: %w", err)
	}
	p.enc, err = encryption.NewManager(encryption.Config{XFRM: x, Firewall: fw, Salts: encryption.Salts(p.secrets.held()),
		Local: addr, Port: p.port, Schedule: encryption.ScheduleEvery(cfg.KeyRotation), Publish: pub.Publish, Logger: p.log,
		Resume: resume})
	if err != nil {
		p.enc = nil
		release()
		return err
	}
	p.release = release
	keys.public.attach(p.enc.ReceiveKeys)
	keys.secrets.attach(p.peerSecrets)
	return nil
}

// StopGossip stops deliveries into the driver; call before Driver.Close.
func (p *Plane) StopGossip() {
	p.stopRun()
	p.runs.Wait()
	p.stopHealth()
	if p.cluster != nil {
		if err := p.cluster.Close(); err != nil {
			p.log.Warn("stop gossip", "err", err)
		}
	}
}

// StopEncryption leaves the IPsec state in the kernel for the sandboxes
// Driver.Close kept and the next run; call after Driver.Close.
func (p *Plane) StopEncryption() {
	if p.enc != nil {
		p.enc.Detach()
	}
	p.release()
}

var (
	errNoGossip     = fmt.Errorf("%w: the gossip control plane is not running (--gossip-port 0, or still starting)", driver.ErrNotFound)
	errNoEncryption = fmt.Errorf("%w: encryption is not running (no --secret-file, or still starting)", driver.ErrNotFound)
)

// Cluster is the admin API's view of the gossip members and statistics.
func (p *Plane) Cluster() (any, error) {
	if p == nil || p.cluster == nil {
		return nil, errNoGossip
	}
	var secrets *encryption.SecretsStatus
	if s, ok := p.SecretsStatus(); ok {
		secrets = &s
	}
	return struct {
		Members []cluster.Member          `json:"members"`
		Secrets *encryption.SecretsStatus `json:"secrets,omitempty"`
		Stats   cluster.Stats             `json:"stats"`
	}{p.cluster.Members(), secrets, p.cluster.Stats()}, nil
}

// Encryption is the admin API's view of the IPsec state.
func (p *Plane) Encryption() (any, error) {
	s, ok := p.EncryptionStatus()
	if !ok {
		return nil, errNoEncryption
	}
	return s, nil
}

// RotateKeys starts a new key generation now.
func (p *Plane) RotateKeys() error {
	if p == nil || p.enc == nil {
		return errNoEncryption
	}
	return p.enc.Rotate()
}

// ClusterStats is the gossip's figures for metrics, if it runs.
func (p *Plane) ClusterStats() (cluster.Stats, bool) {
	if p == nil || p.cluster == nil {
		return cluster.Stats{}, false
	}
	return p.cluster.Stats(), true
}

// EncryptionStatus is the IPsec state for metrics, if encryption runs.
func (p *Plane) EncryptionStatus() (encryption.Status, bool) {
	if p == nil || p.enc == nil {
		return encryption.Status{}, false
	}
	return p.enc.Status(), true
}
