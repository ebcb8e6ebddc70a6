package driver

// Run: the driver's background work, beside encryption's Manager.Run. One
// loop per network runs its reconciler (reconcile.go) when it is kicked
// (a kernel error of the fast path, a torn-down or new sandbox), when the
// sandbox's events show drift, after a failed pass (with backoff), and
// every resync period.

import (
	"context"
	"errors"
	"time"

	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// DefaultResyncPeriod is how often every network is reconciled in full
// when nothing asks for it sooner.
const DefaultResyncPeriod = 30 * time.Second

const (
	// minGap spaces two passes of one network: a burst of events or
	// kicks costs at most one kernel dump per minGap.
	minGap = 100 * time.Millisecond
	// A failed pass is retried after backoffMin, doubling up to
	// backoffMax: a kernel that recovers is caught up within a second.
	backoffMin = 50 * time.Millisecond
	backoffMax = 500 * time.Millisecond
	// peerSettle is how long after the control plane reaches another host its
	// remote endpoints are taken as known: entries nobody wants in an
	// adopted sandbox are removed from then on (see reconcile).
	peerSettle = time.Second
	// eventBatch bounds the events checked under one lock.
	eventBatch = 4096
)

// Run reconciles every network of the driver, at once and then whenever
// needed (see above), until ctx ends; it returns when every loop has
// stopped. Call it once, before Close.
func (d *Driver) Run(ctx context.Context) {
	d.mu.Lock()
	d.runCtx = ctx
	nets := make([]*network, 0, len(d.networks))
	for _, n := range d.networks {
		nets = append(nets, n)
	}
	d.mu.Unlock()
	for _, n := range nets {
		d.startLoop(n)
	}
	t := time.NewTicker(d.resyncPeriod)
	defer t.Stop()
	released := false
	for {
		select {
		case <-ctx.Done():
			d.mu.Lock()
			d.runCtx = nil // no loop starts from now on
			d.mu.Unlock()
			d.loops.Wait()
			return
		case <-t.C:
			// Whatever the control plane delivers has arrived by now.
			d.settle()
			d.kickAll()
			released = d.tendSources(released)
		}
	}
}

// tendSources repairs the source filter, and once the adopted sandboxes'
// stale entries are removable (the same rule as removable's) ends the
// admission of what the previous run's filter admitted: until then a host
// this run has not heard from may still be sending. It returns whether
// that is done.
func (d *Driver) tendSources(released bool) bool {
	if !released && d.peersSettled() && time.Since(d.started) >= d.deadGrace {
		released = true // in the books at least; Repair retries the kernel
		if err := d.sources.ReleaseInherited(); err != nil {
			d.log.Warn("VXLAN source filter release", "why", "the previous run's sources stay admitted until the repair", "err", err)
		}
	}
	if err := d.sources.Repair(); err != nil {
		d.log.Warn("VXLAN source filter repair", "err", err)
	}
	return released
}

// startLoop starts n's loop if Run runs and n has none. Callers may hold
// n.mu.
func (d *Driver) startLoop(n *network) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx := d.runCtx
	if ctx == nil || n.looping || d.networks[n.id] != n {
		return
	}
	n.looping = true
	d.loops.Add(1)
	go func() {
		defer d.loops.Done()
		d.loop(ctx, n)
	}()
}

// kick asks n's loop for a pass; kicks coalesce into one.
func (n *network) kickLoop() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (d *Driver) kickAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.networks {
		n.kickLoop()
	}
}

// settleWhenConnected settles the remote endpoints peerSettle after the
// control plane reaches another host, which re-delivers them meanwhile;
// then the adopted sandboxes lose the entries nobody wants any more. Not
// before: a restarted plugin cut off from the others would take the
// entries of every live remote endpoint for stale ones and cut its
// containers' traffic. Alone for a whole resync period, the periodic
// full pass settles (Run).
func (d *Driver) settleWhenConnected(cp ControlPlane) {
	select {
	case <-cp.Connected():
	case <-d.settled:
		return
	}
	t := time.NewTimer(peerSettle)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.settled:
		return
	}
	d.settle()
	d.kickAll()
}

// settle marks the remote endpoints as known (see peerSettle).
func (d *Driver) settle() { d.settleOnce.Do(func() { close(d.settled) }) }

func (d *Driver) peersSettled() bool {
	select {
	case <-d.settled:
		return true
	default:
		return false
	}
}

// watch is a loop's subscription to its network's sandbox.
type watch struct {
	sandbox string
	events  <-chan kernel.Event
	stop    context.CancelFunc
}

func (w *watch) close() {
	if w.stop != nil {
		w.stop()
	}
	*w = watch{}
}

// loop is one network's reconciler, until ctx ends or the network leaves
// the table.
func (d *Driver) loop(ctx context.Context, n *network) {
	var (
		w       watch
		elog    errLog
		backoff time.Duration
		due     time.Time // no pass before
		pending = true    // a pass at once
	)
	defer w.close()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		if now := time.Now(); pending && !now.Before(due) {
			err, gone := d.loopPass(ctx, n, &w)
			if gone {
				return
			}
			if err != nil {
				elog.log(d.log, n.id, err)
				backoff = min(max(2*backoff, backoffMin), backoffMax)
				due = time.Now().Add(backoff)
			} else {
				pending, backoff = false, 0
				due = time.Now().Add(minGap)
			}
		}
		var wake <-chan time.Time
		if pending {
			timer.Reset(time.Until(due))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-n.gone:
			return
		case <-n.kick:
			pending = true
		case <-wake:
		case e, ok := <-w.events:
			if !ok {
				w.close() // the next pass watches again
				pending = true
				continue
			}
			if d.checkEvents(n, e, w.events) {
				pending = true
			}
		}
	}
}

// loopPass watches n's current sandbox (first, so drift from then on is
// seen) and reconciles it. gone: n left the table, the loop ends.
func (d *Driver) loopPass(ctx context.Context, n *network, w *watch) (err error, gone bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	d.mu.Lock()
	gone = d.networks[n.id] != n
	d.mu.Unlock()
	if gone {
		return nil, true
	}
	var werr error
	if n.sandbox != w.sandbox || w.events == nil {
		w.close()
		if n.sandbox != "" {
			wctx, cancel := context.WithCancel(ctx)
			events, err := d.kernel.Watch(wctx, n.sandbox)
			if err != nil {
				cancel()
				werr = err
			} else {
				*w = watch{sandbox: n.sandbox, events: events, stop: cancel}
			}
		}
	}
	_, err = d.reconcile(n, false)
	return errors.Join(werr, err), false
}

// checkEvents takes first and whatever else is queued on events (up to
// eventBatch) and reports whether they show drift.
func (d *Driver) checkEvents(n *network, first kernel.Event, events <-chan kernel.Event) bool {
	batch := []kernel.Event{first}
	for len(batch) < eventBatch {
		select {
		case e, ok := <-events:
			if !ok {
				return true
			}
			batch = append(batch, e)
			continue
		default:
		}
		break
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return drifted(n, batch)
}
