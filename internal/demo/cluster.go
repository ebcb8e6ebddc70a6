package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

const (
	hosts      = 3
	gossipPort = 7947 // the plugin's default
)

// startCluster builds the switch and the hosts, and starts a plugin with
// gossip on each, all sharing a fresh cluster secret; h2 and h3 join h1.
func (r *run) startCluster(ctx context.Context) error {
	r.out.step("Creating a switch and %d hosts (network namespaces)", hosts)
	var err error
	if r.topo, err = r.bed.NewTopology(testbed.IPv4, hosts); err != nil {
		return err
	}
	r.out.say("switch: namespace %s, a bridge", r.topo.Switch.Name)
	for _, h := range r.topo.Hosts {
		r.out.say("%s: namespace %s, underlay %s on the switch", h.Name, h.NS.Name, h.Prefix)
	}
	if err := r.topo.WaitUnderlay(10 * time.Second); err != nil {
		return err
	}

	r.out.step("Starting overlay-plugin serve on every host (gossip on, shared secret)")
	secret := filepath.Join(r.bed.Dir(), "secret")
	if err := testbed.WriteSecret(secret); err != nil {
		return err
	}
	r.out.say("cluster secret: %s (base64, 32 random bytes)", secret)
	seed := r.topo.Hosts[0]
	for _, h := range r.topo.Hosts {
		if err := ctx.Err(); err != nil {
			return err
		}
		args := []string{"--gossip-port", strconv.Itoa(gossipPort), "--node-name", h.Name, "--secret-file", secret}
		how := "the seed"
		if h != seed {
			args = append(args, "--join", seed.Underlay.String())
			how = "--join " + seed.Underlay.String()
		}
		p, err := h.StartPlugin(testbed.PluginConfig{Bin: r.bin, Args: args})
		if err != nil {
			return err
		}
		r.plugins = append(r.plugins, p)
		r.out.say("%s: pid %d, %s, gossip on %s:%d, log %s", h.Name, p.Pid(), how, h.Underlay, gossipPort, p.LogFile)
	}
	r.out.say("all %d plugins answer /healthz", hosts)
	return nil
}

// stopPlugins stops every plugin (SIGTERM, then SIGKILL after a grace) and
// says how each ended. An unclean end is shown, not an error: the user may
// have crashed one on purpose while the demo was kept.
func (r *run) stopPlugins() {
	for _, p := range r.plugins {
		if err := p.Stop(0); err != nil {
			r.out.say("%s", r.out.paint(yellow, fmt.Sprintf("plugin on %s: %v", p.Host.Name, err)))
			continue
		}
		r.out.say("stopped the plugin on %s (pid %d)", p.Host.Name, p.Pid())
	}
}
