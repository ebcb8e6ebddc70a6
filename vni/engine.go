package vni

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
)

// The VNI table lives in the state database: with that lost (moved aside)
// or never filled (a node that was not the leader when the networks were
// made), the leader would hand out VNIs that running networks hold. The
// driver recovers those of the networks on this host (driver/restore.go); the
// rest, on a manager, the engine lists: every swarm network with the
// options this plugin returned from AllocateNetwork, VNI included.
//
// The engine is asked in the background, never from inside
// AllocateNetwork: swarm's allocator calls the plugin from the engine, and
// the engine may not serve its API yet while it starts the plugin.
// Allocations wait for it meanwhile (Allocator.Hold), each for at most
// HoldWait, then fail and are retried by swarm's allocator.
const (
	HoldWait = 10 * time.Second
	// recoveryFor bounds the attempts; then the plugin goes on with
	// what this host knows, and says so.
	recoveryFor = 2 * time.Minute
)

// NetworkLister is the engine's network list (dockerengine.Client).
type NetworkLister interface {
	Networks(ctx context.Context) ([]dockerengine.Network, error)
}

// RecoverFromEngine records in a the VNI of every network of this driver
// the engine lists, which keeps it in the driver option named option,
// retrying until the engine answers or recoveryFor passes, then calls
// release (of a Hold taken before any allocation could start).
func (a *Allocator) RecoverFromEngine(ctx context.Context, engine NetworkLister, option string, release func(), log *slog.Logger) {
	defer release()
	ctx, cancel := context.WithTimeout(ctx, recoveryFor)
	defer cancel()
	wait := 500 * time.Millisecond
	for {
		nets, err := engine.Networks(ctx)
		if err == nil {
			n := 0
			for _, nw := range nets {
				v, ok := vniOf(nw, option)
				if !ok {
					continue
				}
				if err := a.Recover(nw.ID, v); err != nil {
					log.Error("swarm VNI conflicts", "why", "the VNI of a swarm network is held by another in the VNI table", "network", nw.ID, "name", nw.Name, "vni", v, "err", err)
					continue
				}
				n++
			}
			log.Info("VNIs recovered from Docker", "networks", n)
			return
		}
		// Only a request that reached no engine is worth repeating: one
		// the engine refused (an old engine, a stand-in) stays refused.
		if !errors.As(err, new(*url.Error)) {
			log.Warn("Docker lists no networks", "why", "VNI allocations known only from this host's own state", "err", err)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			log.Warn("Docker engine unreachable", "why", "VNI allocations known only from this host's own state", "err", err)
			return
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// vniOf reads the VNI this plugin gave a network. Docker's own overlay
// keeps its VNIs under another key, from 4096 up.
func vniOf(nw dockerengine.Network, option string) (uint32, bool) {
	s, ok := nw.Options[option]
	if !ok || nw.Driver == "overlay" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == 0 {
		return 0, false
	}
	return uint32(v), true
}
