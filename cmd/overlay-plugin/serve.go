package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/vishvananda/netns"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/controlplane"
	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/netlinkxfrm"
	"github.com/overlay-plugin/overlay-plugin/enginewatch"
	"github.com/overlay-plugin/overlay-plugin/firewall"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/internal/hostdir"
	"github.com/overlay-plugin/overlay-plugin/internal/httpserve"
	"github.com/overlay-plugin/overlay-plugin/internal/unixsock"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/metrics"
	"github.com/overlay-plugin/overlay-plugin/pluginapi"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
	"github.com/overlay-plugin/overlay-plugin/statedb"
	"github.com/overlay-plugin/overlay-plugin/vni"
	"github.com/overlay-plugin/overlay-plugin/vxlanfilter"
)

// serveDeps are the parts of serve that tests replace.
type serveDeps struct {
	// newKernel builds the data path; the func it returns releases it.
	newKernel func(cfg serveConfig) (kernel.Kernel, func(), error)
	// newUnderlay builds the underlay; the func it returns releases it.
	newUnderlay func(cfg serveConfig) (driver.Underlay, func(), error)
	// readyWait is how long a call arriving during start-up waits for the
	// driver. Docker's own timeout for a plugin call is about 30 s.
	readyWait time.Duration
	// lockWait is how long to wait for the state database's lock, held by
	// another instance on the same state directory.
	lockWait time.Duration
	// httpGrace is how long shutdown lets HTTP requests finish before
	// closing their connections; driver calls already under way are always
	// waited for.
	httpGrace time.Duration
	// readTimeout bounds the reading of one request, body included.
	readTimeout time.Duration
	// advertiseWait is how long to wait for Docker to name this node's
	// address before taking the default route's.
	advertiseWait time.Duration
	// newHealthKernel builds the kernel of the data-path probes'
	// endpoints; nil: the data path is not probed.
	newHealthKernel func(cfg serveConfig) (health.Kernel, func(), error)
	// newEncryption builds the xfrm and firewall side of encryption, for
	// VXLAN on port.
	newEncryption func(cfg serveConfig, port uint16) (encryption.XFRM, encryption.Firewall, func(), error)
	// gossipTransport, if set, replaces memberlist's network transport.
	gossipTransport memberlist.Transport
	// newLoadBalancer programs service VIPs into containers.
	newLoadBalancer func() driver.LoadBalancer
	// servicePeriod is how often the engine is asked for the services of
	// the networks with containers here (0: enginewatch's default).
	servicePeriod time.Duration
	// newSourceFilter builds the VXLAN source filter; nil: none.
	newSourceFilter func() sourceFilter
}

// sourceFilter is the VXLAN source filter as serve drives it
// (vxlanfilter.Filter).
type sourceFilter interface {
	driver.Sources
	Keep() (vnis, vteps int, err error)
	SetMembers(vteps []netip.Addr) error
	Close() error
	Status() (vxlanfilter.Status, error)
}

func defaultDeps() serveDeps {
	return serveDeps{
		newKernel: func(cfg serveConfig) (kernel.Kernel, func(), error) {
			k, err := kernel.NewNetlink(kernel.NetlinkConfig{SandboxDir: cfg.SandboxDir})
			if err != nil {
				return nil, nil, err
			}
			return k, func() { k.Close() }, nil
		},
		newUnderlay: func(serveConfig) (driver.Underlay, func(), error) {
			u, err := kernel.NewUnderlay(netns.None())
			if err != nil {
				return nil, nil, err
			}
			return u, u.Close, nil
		},
		newHealthKernel: func(cfg serveConfig) (health.Kernel, func(), error) {
			// A directory of their own, inside the sandboxes' (whose
			// listing skips directories), so the driver never takes the
			// endpoints for networks.
			k, err := kernel.NewNetlink(kernel.NetlinkConfig{SandboxDir: filepath.Join(cfg.SandboxDir, "health")})
			if err != nil {
				return nil, nil, err
			}
			return k, func() { k.Close() }, nil
		},
		readyWait:       25 * time.Second,
		lockWait:        2 * time.Second,
		httpGrace:       10 * time.Second,
		readTimeout:     30 * time.Second,
		advertiseWait:   10 * time.Second,
		newEncryption:   newNetlinkEncryption,
		newLoadBalancer: func() driver.LoadBalancer { return servicelb.NewNftables() },
		newSourceFilter: func() sourceFilter { return vxlanfilter.New(nil, "") },
	}
}

// runServe is the serve subcommand. Its log lines go to stdout (INFO,
// DEBUG) and stderr (WARN, ERROR), see newServeLogger; a bad command line
// is reported on stderr.
func runServe(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseServeConfig(args, getenv, stderr)
	if err != nil {
		return reportErr(stderr, err)
	}
	log := newServeLogger(stdout, stderr, cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, cfg, defaultDeps(), log); err != nil {
		log.Error("overlay plugin stopped", "err", err)
		return 1
	}
	return 0
}

// serve runs the plugin until ctx is done, then shuts down gracefully:
// it stops accepting, waits for the calls under way, leaves the sandboxes
// and the IPsec state in the kernel for the next run (Driver.Close,
// encryption.Manager.Detach), closes the state database and removes its
// sockets. It returns nil after a clean shutdown.
//
// Start-up is ordered for Docker, which gives a plugin about 10 s to
// create its socket: the plugin socket listens first, and calls arriving
// before the driver is built wait for it.
func serve(ctx context.Context, cfg serveConfig, deps serveDeps, log *slog.Logger) (retErr error) {
	log.Info("overlay plugin starting", "version", version, "commit", commit, "socket", cfg.Socket, "state_dir", cfg.StateDir,
		"sandbox_dir", cfg.SandboxDir, "admin_socket", cfg.AdminSocket, "advertise_addr", cfg.AdvertiseAddr, "vxlan_port", cfg.VXLANPort)
	calls := metrics.NewCalls()
	g := pluginapi.NewGate[*driver.Driver](log, deps.readyWait, calls)
	// Closing order, whatever the failure: stop the servers, wait for the
	// calls under way, then release the driver, kernel, database, sockets.
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()

	// 1. The plugin socket, served at once.
	pl, err := unixsock.Listen(cfg.Socket, 0o755, 0o660)
	if err != nil {
		return fmt.Errorf("plugin socket: %w", err)
	}
	closers = append(closers, func() { unixsock.Remove(log, cfg.Socket) })
	serverErrs := make(chan error, 3)
	pluginSrv := httpserve.Start(pl, pluginapi.NewHandler(g, log), serverErrs, "plugin API", deps.readTimeout)

	// 2. The state database. A damaged or newer one stops the plugin here,
	// before anything is removed on its word (see statedb); bbolt locks the
	// file, so a second instance on the same state directory fails too.
	// The managed plugin's state and sandbox directories are links into its
	// mounts of the host's /var/lib and /run (plugin/config.json), made here
	// on first start; from here on they are used by their real paths.
	if cfg.StateDir, err = hostdir.Make(cfg.StateDir, 0o700); err != nil {
		return stopServers(log, g, deps, fmt.Errorf("state directory: %w", err), pluginSrv)
	}
	if cfg.SandboxDir, err = hostdir.Make(cfg.SandboxDir, 0o755); err != nil {
		return stopServers(log, g, deps, fmt.Errorf("sandbox directory: %w", err), pluginSrv)
	}
	dbPath := filepath.Join(cfg.StateDir, stateDBName)
	_, statErr := os.Stat(dbPath)
	db, err := statedb.Open(dbPath, statedb.Options{LockWait: deps.lockWait, Logger: log})
	if err != nil {
		return stopServers(log, g, deps, fmt.Errorf("open state database: %w", err), pluginSrv)
	}
	closers = append(closers, func() {
		if err := db.Close(); err != nil {
			log.Warn("close state database", "err", err)
		}
	})

	// The VXLAN source filter, taking over the previous run's table
	// before the driver adopts that run's sandboxes.
	filter := openSourceFilter(cfg, deps, log)

	// 3. The admin socket: /healthz says 503 until the driver is ready.
	al, err := unixsock.Listen(cfg.AdminSocket, 0o700, 0o600)
	if err != nil {
		return stopServers(log, g, deps, fmt.Errorf("admin socket: %w", err), pluginSrv)
	}
	closers = append(closers, func() { unixsock.Remove(log, cfg.AdminSocket) })
	var plane atomic.Pointer[controlplane.Plane] // set once it runs
	metricsH := metrics.Handler(metricsSources(g, &plane, filter), calls)
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", metricsH)
	admin.Handle("/", adminapi.NewServer(adminBackend{g, &plane, cfg.GossipPort != 0}, g.Ready, log))
	adminSrv := httpserve.Start(al, admin, serverErrs, "admin API", deps.readTimeout)
	servers := []*http.Server{pluginSrv, adminSrv}
	if cfg.MetricsAddr != "" {
		ml, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return stopServers(log, g, deps, fmt.Errorf("metrics address: %w", err), servers...)
		}
		only := http.NewServeMux()
		only.Handle("GET /metrics", metricsH)
		servers = append(servers, httpserve.Start(ml, only, serverErrs, "metrics", deps.readTimeout))
		log.Info("serving metrics", "addr", ml.Addr())
	}

	// 4. The driver, which adopts what a previous run left in the kernel
	// and removes its provable leftovers, on the VXLAN port known so far
	// (a first run given none learns it in 5).
	port, err := controlplane.StartPort(db, cfg.VXLANPort, statErr == nil)
	if err != nil {
		log.Warn("VXLAN port not read", "err", err, "why", "it is settled again, as on a first run")
		port = controlplane.PortChoice{}
	}
	cfg.VXLANPort = port.Port
	drv, vnis, release, err := buildDriver(cfg, deps, db, filter, log)
	if err != nil {
		g.Fail(err)
		return stopServers(log, g, deps, err, servers...)
	}
	closers = append(closers, release)
	// One client of the engine, if there is one, for what the plugin asks
	// it: the swarm's VNIs, its services, its nodes.
	var engine *dockerengine.Client
	if cfg.DockerSocket != "" {
		engine = dockerengine.New(cfg.DockerSocket)
		closers = append(closers, engine.Close)
	}
	// The VNIs a lost state held, from the engine, before any is handed
	// out (vni/engine.go).
	vniCtx, stopVNIs := context.WithCancel(ctx)
	defer stopVNIs()
	vniDone := closedCh()
	if engine != nil {
		releaseVNIs := vnis.Hold(vni.HoldWait)
		vniDone = goDone(func() { vnis.RecoverFromEngine(vniCtx, engine, driver.OptVNI, releaseVNIs, log) })
	} else {
		log.Info("no Docker socket for VNIs", "why", "VNI allocations known only from this host's own state")
	}
	g.SetDriver(drv)
	log.Info("overlay plugin ready")

	// 5. The control plane, once this host's address is settled (Docker
	// names it just after start). Joins wait for it meanwhile.
	var healthKernel health.Kernel
	if deps.newHealthKernel != nil && cfg.ProbeInterval > 0 {
		hk, release, err := deps.newHealthKernel(cfg)
		if err != nil {
			log.Warn("data path probes unavailable", "err", err)
		} else {
			healthKernel = hk
			closers = append(closers, release)
		}
	}
	cpErr := make(chan error, 1)
	go func() {
		newEncryption := func(port uint16) (encryption.XFRM, encryption.Firewall, func(), error) {
			return deps.newEncryption(cfg, port)
		}
		p, err := controlplane.Start(ctx, controlplane.Config{Addr: cfg.AdvertiseAddr, AdvertiseWait: deps.advertiseWait,
			GossipPort: cfg.GossipPort, Join: cfg.Join, NodeName: cfg.NodeName, SecretFile: cfg.SecretFile, DeadGrace: cfg.DeadGrace,
			RestartGrace: cfg.RestartGrace, KeyRotation: cfg.KeyRotation, Port: port, Transport: deps.gossipTransport,
			NewEncryption: newEncryption, DB: db, Engine: engine, Health: healthKernel, ProbeInterval: cfg.ProbeInterval,
			MemberVTEPs: memberVTEPs(filter, log), Logger: log}, drv)
		if err == nil {
			plane.Store(p)
		}
		cpErr <- err
	}()

	// 6. The networks' reconcilers (the driver's New ran the first pass
	// before ready): on drift events, after kernel errors, periodically.
	resyncCtx, stopResync := context.WithCancel(ctx)
	resyncDone := goDone(func() { drv.Run(resyncCtx) })

	// 7. Service VIPs: the engine lists each network's services.
	svcDone := closedCh()
	if engine != nil {
		w := enginewatch.NewServices(engine, drv, deps.servicePeriod, log.With("component", "services"))
		drv.SetServiceWatch(w.Changed)
		svcDone = goDone(func() { w.Run(resyncCtx) })
	} else {
		log.Info("no Docker socket for services", "why", "service VIPs are not balanced", "hint", "use --endpoint-mode dnsrr, or give --docker-socket")
	}

	var cpDone bool
	select {
	case <-ctx.Done():
	case err := <-serverErrs:
		retErr = err
	case err := <-cpErr:
		cpDone = true
		// A start that ended with ctx is the stop, not a failure; ctx's
		// case below takes it (both may be ready when select looks).
		if err != nil && !errors.Is(err, context.Canceled) {
			retErr = fmt.Errorf("control plane: %w", err)
			break
		}
		select {
		case <-ctx.Done():
		case err := <-serverErrs:
			retErr = err
		}
	}
	if retErr == nil {
		log.Info("overlay plugin stopping", "cause", context.Cause(ctx))
	}
	retErr = stopServers(log, g, deps, retErr, servers...)
	if !cpDone {
		// ctx is done or a server failed: a start still waiting for the
		// address ends with ctx; one under way finishes first.
		if err := <-cpErr; err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("control plane start", "err", err)
		}
	}
	stopResync()
	<-resyncDone
	<-svcDone
	stopVNIs()
	<-vniDone
	p := plane.Load()
	if p != nil {
		p.StopGossip()
	}
	drv.Close()
	if p != nil {
		p.StopEncryption()
	}
	if retErr == nil {
		log.Info("overlay plugin stopped")
	}
	return retErr
}

// buildDriver builds the kernel, underlay, VNI table and driver. release
// frees the kernel and underlay handles (after Driver.Close).
func buildDriver(cfg serveConfig, deps serveDeps, db *bbolt.DB, filter sourceFilter, log *slog.Logger) (*driver.Driver, *vni.Allocator, func(), error) {
	var releases []func()
	release := func() {
		for i := len(releases) - 1; i >= 0; i-- {
			releases[i]()
		}
	}
	k, rk, err := deps.newKernel(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kernel data path: %w", err)
	}
	releases = append(releases, rk)
	u, ru, err := deps.newUnderlay(cfg)
	if err != nil {
		release()
		return nil, nil, nil, fmt.Errorf("underlay: %w", err)
	}
	releases = append(releases, ru)
	vnis, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	// With a secret, the encryption side is connected once the control
	// plane starts (controlplane.Start).
	drv, err := driver.New(driver.Config{Kernel: k, Underlay: u, VNIs: vnis, DB: db, AdvertiseAddr: cfg.AdvertiseAddr,
		VXLANPort: cfg.VXLANPort, ExpectEncryption: cfg.SecretFile != "" && cfg.GossipPort != 0,
		LoadBalancer: deps.newLoadBalancer(), Sources: filter, SandboxDir: cfg.DockerNetnsDir, ResyncPeriod: cfg.ResyncPeriod,
		DeadGrace: cfg.DeadGrace, Logger: log})
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	return drv, vnis, release, nil
}

// stopServers closes the listeners, lets requests finish for
// deps.httpGrace, then waits for every driver call still under way (the
// gate's count, which outlives forcibly closed connections). It returns
// cause.
func stopServers(log *slog.Logger, g *gate, deps serveDeps, cause error, servers ...*http.Server) error {
	g.Stop()
	httpserve.Shutdown(log, deps.httpGrace, servers...)
	if n := g.InFlight(); n > 0 {
		log.Info("waiting for driver calls under way", "count", n)
	}
	g.Drain()
	return cause
}

// newNetlinkEncryption is the real xfrm and nftables side.
func newNetlinkEncryption(_ serveConfig, port uint16) (encryption.XFRM, encryption.Firewall, func(), error) {
	x, err := netlinkxfrm.New(netns.None())
	if err != nil {
		return nil, nil, nil, err
	}
	return x, firewall.New(nil, port, encryption.Mark), func() { x.Close() }, nil
}

// goDone runs f in the background; the channel is closed once it returns.
func goDone(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	return done
}

// closedCh is the done channel of what never ran.
func closedCh() <-chan struct{} {
	done := make(chan struct{})
	close(done)
	return done
}
