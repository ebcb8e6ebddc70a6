package pluginapi

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// ErrUnavailable marks a call refused because the driver cannot serve now:
// not built yet, failed to build, or shutting down. The admin API answers
// it with 503.
var ErrUnavailable = errors.New("service unavailable")

// Observer records one call: its name, duration and outcome.
type Observer interface {
	Observe(call string, d time.Duration, err error)
}

// Gate admits calls to a driver D that does not exist yet when the sockets
// start listening. A call made before the driver is ready waits for it (up
// to readyWait). Every call is counted in flight so that shutdown can wait
// for the calls under way before closing the driver; once shutdown has
// begun, new calls fail at once. Calls are logged at debug level with their
// duration, failures at warn.
type Gate[D any] struct {
	log       *slog.Logger
	readyWait time.Duration
	calls     Observer // safe for concurrent use

	// ready is closed once drv or initErr is set; both are read-only after.
	ready   chan struct{}
	drv     D
	initErr error
	// stopping is closed when shutdown begins, releasing calls still waiting
	// for the driver.
	stopping chan struct{}

	// mu guards closing, count and the Add side of inflight, so that no
	// call can enter after Drain has started waiting.
	mu       lockrank.Mutex[lockrank.Gate]
	closing  bool
	inflight sync.WaitGroup
	count    int
}

// NewGate returns a gate that admits no call until SetDriver or Fail.
func NewGate[D any](log *slog.Logger, readyWait time.Duration, calls Observer) *Gate[D] {
	return &Gate[D]{log: log, readyWait: readyWait, calls: calls, ready: make(chan struct{}), stopping: make(chan struct{})}
}

// SetDriver makes the driver available; call once, or Fail instead.
func (g *Gate[D]) SetDriver(d D) {
	g.drv = d
	close(g.ready)
}

// Fail records that the driver could not be built: waiting and later calls
// get err.
func (g *Gate[D]) Fail(err error) {
	g.initErr = err
	close(g.ready)
}

// Driver is the driver while calls are served (Ready), for reads that are
// not calls (metrics): neither counted nor logged.
func (g *Gate[D]) Driver() (D, bool) {
	if !g.Ready() {
		var zero D
		return zero, false
	}
	return g.drv, true
}

// Ready reports whether calls are served now.
func (g *Gate[D]) Ready() bool {
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

// Stop refuses new calls from now on. Idempotent.
func (g *Gate[D]) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closing {
		g.closing = true
		close(g.stopping)
	}
}

// InFlight is the number of calls under way.
func (g *Gate[D]) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// Drain stops new calls and waits for those under way.
func (g *Gate[D]) Drain() {
	g.Stop()
	g.inflight.Wait()
}

var errShuttingDown = fmt.Errorf("overlay plugin is shutting down: %w", ErrUnavailable)

// begin admits a call, waiting for the driver if needed.
func (g *Gate[D]) begin() error {
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
			return fmt.Errorf("overlay plugin is still starting after %s: %w", g.readyWait, ErrUnavailable)
		}
	}
	if g.initErr != nil {
		return fmt.Errorf("overlay plugin failed to start: %v: %w", g.initErr, ErrUnavailable)
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

func (g *Gate[D]) end() {
	g.mu.Lock()
	g.count--
	g.mu.Unlock()
	g.inflight.Done()
}

// Call runs f on the driver as one admitted, counted, logged call. A panic
// in the driver becomes an error: the plugin keeps serving its other
// networks (Docker replays nothing to a restarted plugin).
func Call[D, T any](g *Gate[D], name string, attrs []any, f func(D) (T, error)) (res T, err error) {
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

// Call0 is Call for a call that returns only an error.
func Call0[D any](g *Gate[D], name string, attrs []any, f func(D) error) error {
	_, err := Call(g, name, attrs, func(d D) (struct{}, error) { return struct{}{}, f(d) })
	return err
}
