package main

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/metrics"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// backend is what the guard delegates to; *driver.Driver implements it.
type backend interface {
	api.Driver
	adminapi.Backend
	Repairs() map[string]uint64
	Stats() []driver.NetworkStats
}

var (
	_ backend = (*driver.Driver)(nil)
	_ backend = (*guard)(nil)
)

// guard stands between the API servers and the driver, which does not exist
// yet when the sockets start listening. A call made before the driver is
// ready waits for it (up to readyWait). Every call is counted in flight so
// that shutdown can wait for the calls under way before closing the driver;
// once shutdown has begun, new calls fail at once. Calls are logged at debug
// level with their duration, failures at warn.
type guard struct {
	log       *slog.Logger
	readyWait time.Duration
	calls     *metrics.Calls // safe for concurrent use

	// ready is closed once drv or initErr is set; both are read-only after.
	ready   chan struct{}
	drv     backend
	initErr error
	// stopping is closed when shutdown begins, releasing calls still waiting
	// for the driver.
	stopping chan struct{}

	// mu guards closing and the Add side of inflight, so that no call can
	// enter after drain has started waiting.
	mu       lockrank.Mutex[lockrank.Guard]
	closing  bool
	inflight sync.WaitGroup
	count    int
}

func newGuard(log *slog.Logger, readyWait time.Duration) *guard {
	return &guard{log: log, readyWait: readyWait, calls: metrics.NewCalls(), ready: make(chan struct{}), stopping: make(chan struct{})}
}

// setDriver makes the driver available; call once, or fail instead.
func (g *guard) setDriver(d backend) {
	g.drv = d
	close(g.ready)
}

// fail records that the driver could not be built: waiting and later calls
// get err.
func (g *guard) fail(err error) {
	g.initErr = err
	close(g.ready)
}

// Stats is the driver's figures for metrics: nil until the driver is
// ready, and not counted or logged as a call.
func (g *guard) Stats() []driver.NetworkStats {
	if !g.Ready() {
		return nil
	}
	return g.drv.Stats()
}

// Repairs is the reconcilers' repair counts for metrics: nil until the
// driver is ready.
func (g *guard) Repairs() map[string]uint64 {
	if !g.Ready() {
		return nil
	}
	return g.drv.Repairs()
}

// Ready reports whether calls are served now.
func (g *guard) Ready() bool {
	select {
	case <-g.ready:
	default:
		return false
	}
	if g.initErr != nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.closing
}

// stop refuses new calls from now on. Idempotent.
func (g *guard) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closing {
		g.closing = true
		close(g.stopping)
	}
}

// inFlight is the number of calls under way.
func (g *guard) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// drain stops new calls and waits for those under way.
func (g *guard) drain() {
	g.stop()
	g.inflight.Wait()
}

var errShuttingDown = fmt.Errorf("overlay plugin is shutting down: %w", adminapi.ErrUnavailable)

// begin admits a call, waiting for the driver if needed.
func (g *guard) begin() error {
	select {
	case <-g.ready:
	default:
		t := time.NewTimer(g.readyWait)
		defer t.Stop()
		select {
		case <-g.ready:
		case <-g.stopping:
			return errShuttingDown
		case <-t.C:
			return fmt.Errorf("overlay plugin is still starting after %s: %w", g.readyWait, adminapi.ErrUnavailable)
		}
	}
	if g.initErr != nil {
		return fmt.Errorf("overlay plugin failed to start: %v: %w", g.initErr, adminapi.ErrUnavailable)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return errShuttingDown
	}
	g.inflight.Add(1)
	g.count++
	return nil
}

func (g *guard) end() {
	g.mu.Lock()
	g.count--
	g.mu.Unlock()
	g.inflight.Done()
}

// call runs f on the driver as one counted, logged call. A panic in the
// driver becomes an error: the plugin keeps serving its other networks
// (Docker replays nothing to a restarted plugin).
func call[T any](g *guard, name string, attrs []any, f func(backend) (T, error)) (res T, err error) {
	start := time.Now()
	if err := g.begin(); err != nil {
		g.calls.Observe(name, time.Since(start), err)
		g.log.Warn("driver call refused", append([]any{"call", name, "err", err}, attrs...)...)
		return res, err
	}
	defer func() {
		if v := recover(); v != nil {
			g.log.Error("driver call panicked", append([]any{"call", name, "panic", v, "stack", string(debug.Stack())}, attrs...)...)
			err = fmt.Errorf("%s: internal error in the overlay plugin: %v", name, v)
		}
		g.end()
		g.calls.Observe(name, time.Since(start), err)
		attrs = append(attrs, "duration", time.Since(start))
		if err != nil {
			g.log.Warn("driver call failed", append([]any{"call", name, "err", err}, attrs...)...)
		} else {
			g.log.Debug("driver call", append([]any{"call", name}, attrs...)...)
		}
	}()
	return f(g.drv)
}

func call0(g *guard, name string, attrs []any, f func(backend) error) error {
	_, err := call(g, name, attrs, func(d backend) (struct{}, error) { return struct{}{}, f(d) })
	return err
}

func netAttrs(nid string) []any     { return []any{"network", nid} }
func epAttrs(nid, eid string) []any { return []any{"network", nid, "endpoint", eid} }

// --- network.Driver ---

func (g *guard) GetCapabilities() (*api.CapabilitiesResponse, error) {
	return call(g, "GetCapabilities", nil, func(d backend) (*api.CapabilitiesResponse, error) { return d.GetCapabilities() })
}

func (g *guard) AllocateNetwork(r *api.AllocateNetworkRequest) (*api.AllocateNetworkResponse, error) {
	return call(g, "AllocateNetwork", netAttrs(r.NetworkID), func(d backend) (*api.AllocateNetworkResponse, error) { return d.AllocateNetwork(r) })
}

func (g *guard) FreeNetwork(r *api.FreeNetworkRequest) error {
	return call0(g, "FreeNetwork", netAttrs(r.NetworkID), func(d backend) error { return d.FreeNetwork(r) })
}

func (g *guard) CreateNetwork(r *api.CreateNetworkRequest) error {
	return call0(g, "CreateNetwork", netAttrs(r.NetworkID), func(d backend) error { return d.CreateNetwork(r) })
}

func (g *guard) DeleteNetwork(r *api.DeleteNetworkRequest) error {
	return call0(g, "DeleteNetwork", netAttrs(r.NetworkID), func(d backend) error { return d.DeleteNetwork(r) })
}

func (g *guard) CreateEndpoint(r *api.CreateEndpointRequest) (*api.CreateEndpointResponse, error) {
	return call(g, "CreateEndpoint", epAttrs(r.NetworkID, r.EndpointID), func(d backend) (*api.CreateEndpointResponse, error) { return d.CreateEndpoint(r) })
}

func (g *guard) DeleteEndpoint(r *api.DeleteEndpointRequest) error {
	return call0(g, "DeleteEndpoint", epAttrs(r.NetworkID, r.EndpointID), func(d backend) error { return d.DeleteEndpoint(r) })
}

func (g *guard) EndpointInfo(r *api.InfoRequest) (*api.InfoResponse, error) {
	return call(g, "EndpointOperInfo", epAttrs(r.NetworkID, r.EndpointID), func(d backend) (*api.InfoResponse, error) { return d.EndpointInfo(r) })
}

func (g *guard) Join(r *api.JoinRequest) (*api.JoinResponse, error) {
	return call(g, "Join", epAttrs(r.NetworkID, r.EndpointID), func(d backend) (*api.JoinResponse, error) { return d.Join(r) })
}

func (g *guard) Leave(r *api.LeaveRequest) error {
	return call0(g, "Leave", epAttrs(r.NetworkID, r.EndpointID), func(d backend) error { return d.Leave(r) })
}

func (g *guard) DiscoverNew(n *api.DiscoveryNotification) error {
	return call0(g, "DiscoverNew", []any{"type", n.DiscoveryType}, func(d backend) error { return d.DiscoverNew(n) })
}

func (g *guard) DiscoverDelete(n *api.DiscoveryNotification) error {
	return call0(g, "DiscoverDelete", []any{"type", n.DiscoveryType}, func(d backend) error { return d.DiscoverDelete(n) })
}

func (g *guard) ProgramExternalConnectivity(r *api.ProgramExternalConnectivityRequest) error {
	return call0(g, "ProgramExternalConnectivity", epAttrs(r.NetworkID, r.EndpointID), func(d backend) error { return d.ProgramExternalConnectivity(r) })
}

func (g *guard) RevokeExternalConnectivity(r *api.RevokeExternalConnectivityRequest) error {
	return call0(g, "RevokeExternalConnectivity", epAttrs(r.NetworkID, r.EndpointID), func(d backend) error { return d.RevokeExternalConnectivity(r) })
}

// --- adminapi.Backend ---

func (g *guard) State() []driver.NetworkState {
	s, err := call(g, "State", nil, func(d backend) ([]driver.NetworkState, error) { return d.State(), nil })
	if err != nil {
		return nil
	}
	return s
}

func (g *guard) AddPeer(nid string, p peerdb.Peer) error {
	return call0(g, "AddPeer", epAttrs(nid, p.EndpointID), func(d backend) error { return d.AddPeer(nid, p) })
}

func (g *guard) DeletePeer(nid, eid string) error {
	return call0(g, "DeletePeer", epAttrs(nid, eid), func(d backend) error { return d.DeletePeer(nid, eid) })
}
