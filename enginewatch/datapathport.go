package enginewatch

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"time"
)

// portWait bounds the wait for the engine to say its swarm's data-path
// port.
const portWait = 5 * time.Second

// DataPathPortEngine says the swarm's data-path port (dockerengine.Client).
type DataPathPortEngine interface {
	DataPathPort(ctx context.Context) (uint16, bool, error)
}

// CheckDataPathPort compares this run's VXLAN port with Docker's swarm
// data-path port, where the engine says it (a manager's does; a worker's
// does not), and warns when they differ: Docker's own overlay then uses
// another port, which a firewall must let through too. The plugin does
// not follow it: a worker cannot learn it, and nodes on different ports
// refuse each other.
func CheckDataPathPort(ctx context.Context, port uint16, engine DataPathPortEngine, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, portWait)
	defer cancel()
	for {
		dp, ok, err := engine.DataPathPort(ctx)
		var ue *url.Error
		if err != nil && errors.As(err, &ue) && ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond) // not listening yet
			continue
		}
		switch {
		case err != nil:
			log.Debug("Docker data-path port unknown", "err", err)
		case ok && dp != port:
			log.Warn("VXLAN port differs from Docker's", "vxlan_port", port, "docker_data_path_port", dp,
				"why", "Docker's own overlay uses the swarm's data-path port, this plugin its --vxlan-port: a firewall must pass both",
				"hint", "to use one port, set OVERLAY_VXLAN_PORT to the data-path port on every node")
		}
		return
	}
}
