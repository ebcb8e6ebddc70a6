// Services learns the swarm services of the plugin's networks
// from the local Docker engine and hands each network's virtual IPs and
// backends to the driver, which programs them into its containers.
//
// Docker allocates a VIP for every default-mode service and publishes it
// in its DNS, and every node's engine lists a network's services with
// their VIPs and tasks (verbose network inspect, from Docker's own
// gossip), but it builds a load balancer only for its own overlay. The
// engine sends no event when a task on ANOTHER node starts or stops, so
// the watcher asks it:
//
//   - when the plugin's own gossip reports an endpoint of the network
//     joining or leaving anywhere (Changed), at once and again after
//     followUps, since Docker's gossip may trail the plugin's;
//   - every period for each network with local containers, for what no
//     endpoint change shows (a service created or removed, a VIP).
//
// So a new backend is used within about a second of both gossips knowing
// it, anything else within period, and one request per network and
// change (coalesced) or period is all the engine sees. A backend that
// left is dropped sooner, by the driver, as soon as the plugin's gossip
// withdraws its endpoint.

package enginewatch

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// DefaultPeriod is how often Services asks for each network's services.
const DefaultPeriod = 5 * time.Second

// followUps are the delays after a change at which the network is asked
// again: Docker's gossip of the same task may arrive after the plugin's.
var followUps = []time.Duration{100 * time.Millisecond, 400 * time.Millisecond, time.Second, 2 * time.Second}

// minGap spaces the requests a stream of changes causes for one network.
const minGap = 100 * time.Millisecond

// ServiceEngine answers what services a network has (dockerengine.Client).
type ServiceEngine interface {
	NetworkServices(ctx context.Context, networkID string) ([]dockerengine.Service, error)
}

// Driver is where the services go (driver.Driver).
type Driver interface {
	// ServiceNetworks lists the networks with containers on this host.
	ServiceNetworks() []string
	// SetServices replaces a network's services.
	SetServices(networkID string, svcs []driver.Service) error
}

// Services polls the engine for the services of the networks that need
// it.
type Services struct {
	engine ServiceEngine
	drv    Driver
	period time.Duration
	log    *slog.Logger

	// mu guards due and asked. A leaf: nothing else is locked or called
	// under it.
	mu lockrank.Mutex[lockrank.ServiceWatch]
	// due maps a network to the times it is to be asked, earliest first;
	// asked to when it was last asked (or was due, with no container
	// here to need it).
	due   map[string][]time.Time
	asked map[string]time.Time
	wake  chan struct{} // 1-buffered
}

// NewServices returns a watcher asking engine every period (0: DefaultPeriod).
func NewServices(engine ServiceEngine, drv Driver, period time.Duration, log *slog.Logger) *Services {
	if period <= 0 {
		period = DefaultPeriod
	}
	return &Services{engine: engine, drv: drv, period: period, log: log,
		due: map[string][]time.Time{}, asked: map[string]time.Time{}, wake: make(chan struct{}, 1)}
}

// Changed says an endpoint of the network joined or left somewhere. It
// never blocks: the driver calls it with a network lock held.
func (w *Services) Changed(networkID string) {
	now := time.Now()
	w.mu.Lock()
	// A burst of changes asks at most every minGap, then once per
	// follow-up of the latest change: not once per change. A follow-up
	// less than minGap after the ask before it is left out (the ask that
	// minGap delayed serves for it).
	first := now
	if next := w.asked[networkID].Add(minGap); next.After(now) {
		first = next
	}
	times := []time.Time{first}
	for _, d := range followUps {
		if t := now.Add(d); !t.Before(times[len(times)-1].Add(minGap)) {
			times = append(times, t)
		}
	}
	w.due[networkID] = times
	w.mu.Unlock()
	select { // the loop waits for the next due time: it may be earlier now
	case w.wake <- struct{}{}:
	default:
	}
}

// Run asks the engine until ctx ends.
func (w *Services) Run(ctx context.Context) {
	tick := time.NewTicker(w.period)
	defer tick.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			nids := w.drv.ServiceNetworks()
			w.startRound(nids)
			for _, nid := range nids {
				w.refresh(ctx, nid)
			}
		case <-w.wake:
		case <-timer.C:
		}
		next := w.runDue(ctx)
		timer.Reset(time.Until(next))
	}
}

// runDue asks for every network that is due and returns when the next
// one will be (an hour away when none is).
func (w *Services) runDue(ctx context.Context) time.Time {
	now := time.Now()
	next := now.Add(time.Hour)
	var nids []string
	w.mu.Lock()
	for nid, times := range w.due {
		i := 0
		for i < len(times) && !times[i].After(now) {
			i++
		}
		if i > 0 {
			nids = append(nids, nid)
			w.asked[nid] = now
		}
		if times = times[i:]; len(times) == 0 {
			delete(w.due, nid)
		} else {
			w.due[nid] = times
			if times[0].Before(next) {
				next = times[0]
			}
		}
	}
	w.mu.Unlock()
	if len(nids) == 0 {
		return next
	}
	needed := w.drv.ServiceNetworks()
	for _, nid := range nids {
		if slices.Contains(needed, nid) { // else no container here needs it
			w.refresh(ctx, nid)
		}
	}
	return next
}

// startRound notes that every network in nids is asked now and drops
// what is kept of the others (deleted here).
func (w *Services) startRound(nids []string) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for nid := range w.asked {
		if !slices.Contains(nids, nid) {
			delete(w.asked, nid)
		}
	}
	for _, nid := range nids {
		w.asked[nid] = now
	}
}

// refresh asks the engine for one network's services and hands them on.
// The caller has noted the ask in asked, under the same hold of mu that
// took it from due (runDue) or before the round (startRound): a Changed
// in between then waits minGap rather than asking again at once.
func (w *Services) refresh(ctx context.Context, nid string) {
	raw, err := w.engine.NetworkServices(ctx, nid)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			w.log.Debug("ask Docker for the network's services", "network", nid, "err", err)
		}
		return
	}
	svcs, skipped := Translate(raw)
	for _, s := range skipped {
		w.log.Warn("service not balanced", "network", nid, "reason", s)
	}
	if err := w.drv.SetServices(nid, svcs); err != nil {
		w.log.Debug("services not applied", "network", nid, "err", err)
	}
}

// Translate turns the engine's services into the driver's: only those
// with a VIP (dnsrr services have none), with their tasks sorted by
// endpoint. The driver balances over the tasks whose endpoints its own
// control plane knows, at their address of the VIP's family. It says why
// it skipped a service whose VIP it could not use.
func Translate(raw []dockerengine.Service) (svcs []driver.Service, skipped []string) {
	for _, r := range raw {
		if r.VIP == "" || r.VIP == "<nil>" {
			// dnsrr: no VIP. The engine prints Go's nil net.IP as "<nil>".
			continue
		}
		vip, err := netip.ParseAddr(r.VIP)
		if err != nil {
			if p, perr := netip.ParsePrefix(r.VIP); perr == nil {
				vip, err = p.Addr(), nil
			}
		}
		if err != nil || !vip.IsGlobalUnicast() {
			skipped = append(skipped, "service "+r.Name+": unusable VIP "+r.VIP)
			continue
		}
		s := driver.Service{Name: r.Name, VIP: vip.Unmap(), Ports: slices.Clone(r.Ports)}
		for _, t := range r.Tasks {
			if t.EndpointID != "" {
				s.Endpoints = append(s.Endpoints, t.EndpointID)
			}
		}
		slices.Sort(s.Endpoints)
		s.Endpoints = slices.Compact(s.Endpoints)
		svcs = append(svcs, s)
	}
	slices.SortFunc(svcs, func(a, b driver.Service) int { return strings.Compare(a.Name, b.Name) })
	return svcs, skipped
}
