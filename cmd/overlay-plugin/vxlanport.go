package main

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/driver"
)

// portWait bounds the wait for the engine to say its swarm's data-path
// port: Joins wait for the control plane, which waits for this.
const portWait = 5 * time.Second

// settleVXLANPort returns the VXLAN port of this run: the setting when it
// is not the default; else Docker's swarm data-path port where the engine
// says it (a manager's does; a worker's does not, and keeps the default),
// set on the driver before any sandbox is built. A setting that differs
// from Docker's is kept, with a WARN.
func settleVXLANPort(ctx context.Context, cfg serveConfig, engine *dockerengine.Client, drv *driver.Driver, log *slog.Logger) uint16 {
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
			log.Info("Docker data-path port unknown", "vxlan_port", cfg.VXLANPort, "err", err)
		case !ok:
			log.Debug("Docker says no data-path port here", "why", "a worker, or no swarm", "vxlan_port", cfg.VXLANPort)
		case dp == cfg.VXLANPort:
		case cfg.VXLANPortGiven:
			log.Warn("VXLAN port differs from Docker's", "vxlan_port", cfg.VXLANPort, "docker_data_path_port", dp,
				"why", "Docker's own overlay and this plugin use different ports, which works as long as every node of the plugin uses the same")
		default:
			drv.SetVXLANPort(dp)
			log.Info("VXLAN port from Docker", "vxlan_port", dp, "why", "the swarm's data-path port (docker swarm init --data-path-port)")
			return dp
		}
		return cfg.VXLANPort
	}
}
