package main

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
)

// A plugin enabled on an existing swarm hears DiscoverNew only for its own
// node: Docker announces the other nodes to a plugin only when they join.
// With the Docker socket at hand (--docker-socket), the plugin asks the
// engine instead: every node knows its managers (GET /info), and a manager
// knows every node (GET /nodes). Those addresses become gossip hints;
// joining any live member is enough, gossip does the rest.

// hintFromDocker passes the swarm's node addresses to hint now and every
// period until ctx ends.
func hintFromDocker(ctx context.Context, c *dockerengine.Client, period time.Duration, hint func(netip.Addr), log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		addrs, err := c.SwarmAddrs(ctx) // what it has, even with an error
		if err != nil {
			log.Debug("ask Docker for the swarm's nodes", "err", err)
		}
		for _, a := range addrs {
			hint(a)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
