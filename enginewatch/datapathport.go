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

// DataPathPort is Docker's swarm data-path port where the engine says it
// (a manager's does; a worker's does not: ok false). An engine that does
// not listen yet is asked again for up to portWait.
func DataPathPort(ctx context.Context, engine DataPathPortEngine, log *slog.Logger) (port uint16, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, portWait)
	defer cancel()
	for {
		dp, ok, err := engine.DataPathPort(ctx)
		var ue *url.Error
		if err != nil && errors.As(err, &ue) && ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond) // not listening yet
			continue
		}
		if err != nil {
			log.Debug("Docker data-path port unknown", "err", err)
			return 0, false
		}
		return dp, ok
	}
}

// WarnDataPathPort warns when this node's VXLAN port differs from Docker's
// data-path port dp (when known): Docker's own overlay then uses another
// port, which a firewall must let through too.
func WarnDataPathPort(port, dp uint16, known bool, log *slog.Logger) {
	if !known || dp == port {
		return
	}
	log.Warn("VXLAN port differs from Docker's", "vxlan_port", port, "docker_data_path_port", dp,
		"why", "Docker's own overlay uses the swarm's data-path port, this plugin its VXLAN port: a firewall must pass both",
		"hint", "the cluster keeps the port it settled first (overlay-plugin cluster shows each node's); to use one port, set OVERLAY_VXLAN_PORT to the data-path port on every node")
}
