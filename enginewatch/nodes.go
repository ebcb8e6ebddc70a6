package enginewatch

import (
	"context"
	"log/slog"
	"net/netip"
	"time"
)

// A plugin enabled on an existing swarm hears DiscoverNew only for its own
// node: Docker announces the other nodes to a plugin only when they join.
// With the Docker socket at hand (--docker-socket), the plugin asks the
// engine instead: every node knows its managers (GET /info), and a manager
// knows every node (GET /nodes). Those addresses become gossip hints;
// joining any live member is enough, gossip does the rest.

// NodesPeriod is how often Nodes asks.
const NodesPeriod = 30 * time.Second

// NodeEngine lists the swarm's node addresses (dockerengine.Client): what
// it learnt even with an error.
type NodeEngine interface {
	SwarmAddrs(ctx context.Context) ([]netip.Addr, error)
}

// Nodes passes the swarm's node addresses to a hint function.
type Nodes struct {
	engine NodeEngine
	hint   func(netip.Addr)
	period time.Duration
	log    *slog.Logger
}

// NewNodes returns a poller asking engine every period (0: NodesPeriod).
func NewNodes(engine NodeEngine, hint func(netip.Addr), period time.Duration, log *slog.Logger) *Nodes {
	if period <= 0 {
		period = NodesPeriod
	}
	return &Nodes{engine: engine, hint: hint, period: period, log: log}
}

// Run asks the engine now and every period until ctx ends.
func (n *Nodes) Run(ctx context.Context) {
	t := time.NewTicker(n.period)
	defer t.Stop()
	for {
		addrs, err := n.engine.SwarmAddrs(ctx) // what it has, even with an error
		if err != nil {
			n.log.Debug("ask Docker for the swarm's nodes", "err", err)
		}
		for _, a := range addrs {
			n.hint(a)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
