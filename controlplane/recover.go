package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// recoverWait bounds the wait for the engine to answer, at start, for the
// endpoints a lost state database forgot. The control plane says its own
// endpoints are all republished (cluster's OwnSettled) only after it, so
// that the other hosts never see them retracted meanwhile.
const recoverWait = 15 * time.Second

// containerLister is the engine as the recovery asks it
// (dockerengine.Client).
type containerLister interface {
	NetworkContainers(ctx context.Context, id string) ([]dockerengine.Attachment, error)
}

// recoverEndpoints gives the driver back the endpoints of the containers
// its sandboxes hold but it has no record of (driver.Strays: the state
// database was lost or unreadable), as the engine lists them; the driver
// checks each against its sandbox. It asks again while the engine does not
// answer, for at most wait, and says in the log what it could not recover
// and why.
func recoverEndpoints(ctx context.Context, engine containerLister, drv *driver.Driver, wait time.Duration, log *slog.Logger) {
	nets := drv.Strays()
	if len(nets) == 0 {
		return
	}
	if engine == nil {
		log.Error("endpoints not recovered", "why", "containers run whose endpoints the state database lost, and without the engine (--docker-socket) nothing names them: the other hosts drop them after the dead grace",
			"networks", nets)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		var again []string
		for _, nid := range nets {
			if recoverNetwork(ctx, engine, drv, nid, log) {
				again = append(again, nid)
			}
		}
		if nets = again; len(nets) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			log.Error("endpoints not recovered", "why", "the engine did not answer in time: the other hosts drop them after the dead grace", "networks", nets, "waited", wait)
			return
		case <-time.After(backoff):
		}
	}
}

// recoverNetwork recovers one network's endpoints; true means ask again
// (the engine did not answer).
func recoverNetwork(ctx context.Context, engine containerLister, drv *driver.Driver, nid string, log *slog.Logger) bool {
	atts, err := engine.NetworkContainers(ctx, nid)
	var transport *url.Error
	switch {
	case errors.As(err, &transport):
		return true
	case errors.Is(err, dockerengine.ErrNotFound):
		log.Warn("endpoints not recovered", "why", "the engine does not know the network", "network", nid)
		return false
	case err != nil:
		log.Error("endpoints not recovered", "why", "the engine's answer is unusable", "network", nid, "err", err)
		return false
	}
	var eps []driver.RecoveredEndpoint
	for _, a := range atts {
		ep, err := recoveredOf(a)
		if err != nil {
			log.Warn("engine endpoint unusable", "network", nid, "container", a.Name, "endpoint", a.EndpointID, "err", err)
			continue
		}
		eps = append(eps, ep)
	}
	ids, err := drv.RecoverEndpoints(nid, eps)
	if err != nil {
		log.Warn("engine endpoints refused", "network", nid, "err", err)
	}
	log.Info("endpoints recovered from the engine", "why", "the state database had lost them", "network", nid,
		"recovered", len(ids), "listed", len(atts), "still unknown", len(drv.Strays()) > 0)
	return false
}

// recoveredOf parses the engine's word for one endpoint.
func recoveredOf(a dockerengine.Attachment) (driver.RecoveredEndpoint, error) {
	ep := driver.RecoveredEndpoint{ID: a.EndpointID}
	var err error
	if ep.MAC, err = hwaddr.Parse(a.MacAddress); err != nil {
		return ep, fmt.Errorf("MAC %q: %w", a.MacAddress, err)
	}
	for _, s := range []string{a.IPv4Address, a.IPv6Address} {
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return ep, fmt.Errorf("address %q: %w", s, err)
		}
		ep.Addrs = append(ep.Addrs, p)
	}
	return ep, nil
}
