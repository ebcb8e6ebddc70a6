package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// GossipPort is the plugin's default gossip port, which the hosts use.
const GossipPort = 7947

// ClusterConfig says how NewCluster runs the hosts' plugins. The zero
// value is three hosts on an IPv4 underlay, the control plane off.
type ClusterConfig struct {
	Hosts    int    // 0: 3
	Underlay Family // 0: IPv4
	// UnderlayWait bounds the wait for the hosts to ping each other
	// (0: 10 s).
	UnderlayWait time.Duration

	// Gossip runs the control plane on GossipPort, each host named by its
	// Name; h2 and later join h1 (--join) unless Discovery. Without it the
	// plugins run with --gossip-port 0 and learn peers from the admin API.
	Gossip bool
	// Discovery sends each plugin Docker's DiscoverNew(Self=false) for
	// every other host when it is enabled; with Gossip, the hosts find
	// each other by these hints alone (no --join), and they are sent once
	// every control plane runs. HintsAtStart sends them, and enables the
	// plugin, the moment its socket answers, as dockerd does.
	Discovery    bool
	HintsAtStart bool

	// Secret gives every host one shared --secret-file; the hosts in
	// OddSecret (0-based) get another one. SecretPerHost gives each host
	// a copy of its own (Node.SecretFile), for a test that changes them
	// one by one.
	Secret        bool
	OddSecret     map[int]bool
	SecretPerHost bool
	// Flags passed when not zero.
	DeadGrace    time.Duration // --dead-grace
	RestartGrace time.Duration // --restart-grace (a release without the flag refuses it)
	KeyRotation  time.Duration // --key-rotation
	ResyncPeriod time.Duration // --resync-period

	// Plugin is every host's PluginConfig before the flags above are
	// added to its Args.
	Plugin PluginConfig
	// HostArgs, if set, adds flags for one host (e.g. a fake engine's
	// socket).
	HostArgs func(h *Host) []string
	// HostBin, if set, names the plugin binary of one host ("": the
	// Plugin's): a cluster of mixed releases.
	HostBin func(h *Host) string
	// ParallelStart starts h1 first, then the others side by side
	// (process starts are slow under emulation).
	ParallelStart bool
}

// Cluster is a topology with a plugin on every host, enabled as dockerd
// enables it, and the endpoints the test made on it: what every host's
// peer table and kernel should hold.
type Cluster struct {
	Bed   *Bed
	Topo  *Topology
	Nodes []*Node
	cfg   ClusterConfig

	// mu guards live, which scenario goroutines change concurrently. A
	// leaf: no call is made while it is held.
	mu   sync.Mutex
	live map[string]*Endpoint // joined and not left, by id
}

// Node is a host of a Cluster and its current plugin.
type Node struct {
	*Host
	Plugin *Plugin
	// Config started Plugin; Restart starts it again.
	Config PluginConfig
	// SecretFile is its --secret-file, if any.
	SecretFile string
}

// NewCluster builds the topology, starts a plugin on every host and
// enables each (GetCapabilities, DiscoverNew) as dockerd does. No network
// exists yet.
func (b *Bed) NewCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.Hosts == 0 {
		cfg.Hosts = 3
	}
	if cfg.Underlay == 0 {
		cfg.Underlay = IPv4
	}
	if cfg.UnderlayWait == 0 {
		cfg.UnderlayWait = 10 * time.Second
	}
	topo, err := b.NewTopology(cfg.Underlay, cfg.Hosts)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	if err := topo.WaitUnderlay(cfg.UnderlayWait); err != nil {
		return nil, fmt.Errorf("underlay: %w", err)
	}
	c := &Cluster{Bed: b, Topo: topo, cfg: cfg, live: map[string]*Endpoint{}}
	for i, h := range topo.Hosts {
		n := &Node{Host: h}
		if n.Config, err = c.pluginConfig(i, n); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	if cfg.ParallelStart {
		err = c.start(c.Nodes[0])
		if err == nil {
			err = c.ForNodes(func(n *Node) error {
				if n == c.Nodes[0] {
					return nil
				}
				return c.start(n)
			})
		}
	} else {
		for _, n := range c.Nodes {
			if err = c.start(n); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, err
	}
	c.keepLogs()
	if cfg.HintsAtStart {
		return c, nil
	}
	if cfg.Gossip && cfg.Discovery {
		// Hints then find a running control plane: this checks the hint ->
		// join path itself, not the start-up race.
		for _, n := range c.Nodes {
			if err := wait.Until(10*time.Second, 20*time.Millisecond, func() error {
				_, err := n.Plugin.AdminGet("/v1/cluster")
				return err
			}); err != nil {
				return nil, fmt.Errorf("%s: control plane not running: %w", n.Name, err)
			}
		}
	}
	for _, n := range c.Nodes {
		if err := c.Enable(n); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// pluginConfig is host i's PluginConfig: cfg.Plugin with the cluster's
// flags.
func (c *Cluster) pluginConfig(i int, n *Node) (PluginConfig, error) {
	cfg := c.cfg
	pc := cfg.Plugin
	args := []string{"--gossip-port", "0"}
	if cfg.Gossip {
		args = []string{"--gossip-port", strconv.Itoa(GossipPort), "--node-name", n.Name}
		if i > 0 && !cfg.Discovery {
			args = append(args, "--join", c.Topo.Hosts[0].Underlay.String())
		}
	}
	if cfg.Secret {
		name := "secret"
		if cfg.OddSecret[i] {
			name = "secret-other"
		}
		path := filepath.Join(c.Bed.Dir(), name)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if err := WriteSecret(path); err != nil {
				return pc, err
			}
		}
		if cfg.SecretPerHost {
			data, err := os.ReadFile(path)
			if err != nil {
				return pc, err
			}
			path = filepath.Join(n.Dir, "secret")
			if err := os.WriteFile(path, data, 0o600); err != nil {
				return pc, err
			}
		}
		n.SecretFile = path
		args = append(args, "--secret-file", path)
	}
	for _, f := range []struct {
		flag string
		d    time.Duration
	}{{"--dead-grace", cfg.DeadGrace}, {"--restart-grace", cfg.RestartGrace}, {"--key-rotation", cfg.KeyRotation}, {"--resync-period", cfg.ResyncPeriod}} {
		if f.d != 0 {
			args = append(args, f.flag, f.d.String())
		}
	}
	if cfg.HostArgs != nil {
		args = append(args, cfg.HostArgs(n.Host)...)
	}
	if cfg.HostBin != nil {
		if bin := cfg.HostBin(n.Host); bin != "" {
			pc.Bin = bin
		}
	}
	pc.Args = append(args, pc.Args...)
	if cfg.HintsAtStart {
		// dockerd's calls as soon as the socket appears; they wait in the
		// plugin until its driver is ready.
		pc.OnSocket = func(p *Plugin) error {
			n.Plugin = p
			return c.Enable(n)
		}
	}
	return pc, nil
}

func (c *Cluster) start(n *Node) error {
	start := time.Now()
	p, err := n.StartPlugin(n.Config)
	if err != nil {
		return fmt.Errorf("start plugin: %w", err)
	}
	n.Plugin = p
	c.Bed.Logf("%s: underlay %s, plugin pid %d ready in %v, args %v, log %s", n.Name, n.Underlay, p.Pid(),
		time.Since(start).Round(time.Millisecond), n.Config.Args, p.LogFile)
	return nil
}

// Restart starts n's plugin again as it was started (after Stop or Kill);
// the caller enables it if the scenario wants dockerd's calls.
func (c *Cluster) Restart(n *Node) error {
	return c.start(n)
}

// Enable does what dockerd does when it enables the plugin on a node:
// GetCapabilities (global scope and connectivity scope), DiscoverNew for
// the node itself and, with Discovery, for every other swarm node (Docker
// knows them all, including nodes whose plugin is not up yet).
func (c *Cluster) Enable(n *Node) error {
	caps, err := n.Plugin.API.Capabilities()
	if err != nil {
		return fmt.Errorf("%s GetCapabilities: %w", n.Name, err)
	}
	if caps.Scope != api.GlobalScope || caps.ConnectivityScope != api.GlobalScope {
		return fmt.Errorf("%s GetCapabilities = %+v, want global scope and connectivity scope", n.Name, *caps)
	}
	if err := n.Plugin.API.DiscoverNode(n.Underlay.String(), true); err != nil {
		return fmt.Errorf("%s DiscoverNew(self): %w", n.Name, err)
	}
	if !c.cfg.Discovery {
		return nil
	}
	for _, h := range c.Topo.Hosts {
		if h != n.Host {
			if err := n.Plugin.API.DiscoverNode(h.Underlay.String(), false); err != nil {
				return fmt.Errorf("%s DiscoverNew(%s, self=false): %w", n.Name, h.Name, err)
			}
		}
	}
	return nil
}

// Node returns the node of host h.
func (c *Cluster) Node(h *Host) *Node {
	for _, n := range c.Nodes {
		if n.Host == h {
			return n
		}
	}
	panic("testbed: host " + h.Name + " is not in the cluster")
}

// Others are the nodes other than n.
func (c *Cluster) Others(n *Node) []*Node {
	var out []*Node
	for _, o := range c.Nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// ForNodes runs fn for every node concurrently and joins the errors.
func (c *Cluster) ForNodes(fn func(n *Node) error) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = fn(n) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// KeepLogsEnv names a directory to copy every plugin log into (one
// subdirectory per test) when a test ends, pass or fail.
const KeepLogsEnv = "OVERLAY_TEST_KEEP_LOGS"

// keepLogs registers the copy; it runs before the Bed's cleanup
// (registered earlier) removes the logs.
func (c *Cluster) keepLogs() {
	dir := os.Getenv(KeepLogsEnv)
	if dir == "" || c.Bed.tb == nil {
		return
	}
	tb := c.Bed.tb
	tb.Cleanup(func() {
		dst := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			tb.Logf("%s: %v", KeepLogsEnv, err)
			return
		}
		for _, n := range c.Nodes {
			data, err := os.ReadFile(n.Plugin.LogFile)
			if err == nil {
				err = os.WriteFile(filepath.Join(dst, n.Name+".log"), data, 0o644)
			}
			if err != nil {
				tb.Logf("%s: %v", KeepLogsEnv, err)
			}
		}
		tb.Logf("plugin logs copied to %s", dst)
	})
}
