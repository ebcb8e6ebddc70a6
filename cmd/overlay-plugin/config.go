package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/internal/admincli"
	"github.com/overlay-plugin/overlay-plugin/internal/envflag"
	"github.com/overlay-plugin/overlay-plugin/internal/unixsock"
)

// Defaults of the serve settings.
const (
	defaultSocket     = "/run/docker/plugins/overlay.sock"
	defaultStateDir   = admincli.DefaultStateDir
	defaultSandboxDir = "/run/overlay-plugin/netns"
	// Docker's NetworkDB gossips on 7946; ours must differ.
	defaultGossipPort = 7947
	defaultDeadGrace  = 30 * time.Second
	// defaultRestartGrace must equal plugin/config.json's value: a plugin
	// upgraded from 0.1.0 keeps 0.1.0's env list, which lacks
	// OVERLAY_RESTART_GRACE, so this default is what applies there
	// (TestConfigJSONEnvDefaults).
	defaultRestartGrace = 10 * time.Minute
	defaultKeyRotation  = time.Hour
	stateDBName         = "state.db"
)

// serveConfig is everything `serve` needs. Every path the plugin writes
// derives from it, so instances with distinct settings never collide.
type serveConfig struct {
	Socket        string
	StateDir      string
	SandboxDir    string
	AdminSocket   string
	AdvertiseAddr netip.Addr // zero: from Docker's DiscoverNew or the default route
	VXLANPort     uint16
	LogLevel      slog.Level

	// GossipPort is the control plane's port; 0 runs without one (peers
	// only through the admin API).
	GossipPort int
	Join       []string
	NodeName   string // empty: <hostname>-<advertise address>
	// SecretFile holds the base64 cluster secret: it authenticates and
	// encrypts gossip and salts the IPsec keys.
	SecretFile string
	DeadGrace  time.Duration
	// RestartGrace replaces DeadGrace for a node that announced its
	// restart (a plugin disable, upgrade or set).
	RestartGrace time.Duration
	KeyRotation  time.Duration
	// DockerSocket, if set, is the Docker engine's API socket, asked for
	// the swarm's node addresses as gossip hints.
	DockerSocket string
	// DockerNetnsDir is where Docker's namespace directory (the one
	// holding the SandboxKeys it passes at Join) is reachable here, for
	// programming service VIPs into containers; empty: the SandboxKeys'
	// own paths.
	DockerNetnsDir string
	// MetricsAddr, if set, is a TCP host:port serving Prometheus metrics
	// (they are on the admin socket's /metrics in any case).
	MetricsAddr string
	// ResyncPeriod is how often every network's kernel state is compared
	// with its peer table in full (drift is repaired sooner, on events).
	ResyncPeriod time.Duration
	// ProbeInterval is the data-path probes' (health.Interval); 0: none.
	ProbeInterval time.Duration
	// VXLANFilter admits VXLAN of the plugin's networks only from the
	// cluster's VTEPs (vxlanfilter); off is unsafe.
	VXLANFilter bool
}

// addrValue is an IP address.
type addrValue struct{ a *netip.Addr }

func (v addrValue) String() string {
	if v.a == nil || !v.a.IsValid() {
		return ""
	}
	return v.a.String()
}

func (v addrValue) Set(s string) error {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("want an IPv4 or IPv6 address: %v", err)
	}
	a = a.Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		return fmt.Errorf("%s cannot be a VTEP address: want a unicast address without zone", a)
	}
	*v.a = a
	return nil
}

// gossipPortValue is a TCP/UDP port, or 0 for none.
type gossipPortValue struct{ p *int }

func (v gossipPortValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v gossipPortValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil {
		return errors.New("want a port number between 0 (no gossip) and 65535")
	}
	*v.p = int(n)
	return nil
}

// parseServeConfig reads serve's settings from args and the environment.
func parseServeConfig(args []string, getenv func(string) string, out io.Writer) (serveConfig, error) {
	cfg := serveConfig{LogLevel: slog.LevelInfo, GossipPort: defaultGossipPort,
		DeadGrace: defaultDeadGrace, RestartGrace: defaultRestartGrace, KeyRotation: defaultKeyRotation, ResyncPeriod: driver.DefaultResyncPeriod,
		ProbeInterval: health.Interval, VXLANFilter: true}
	f := envflag.New("serve", "overlay-plugin serve [flags]\n\nServe Docker's network driver API and the admin API until SIGTERM or SIGINT.", out)
	f.StringEnv(&cfg.Socket, "socket", "OVERLAY_SOCKET", defaultSocket, "unix socket of Docker's network driver API")
	admincli.Flags(f, &cfg.StateDir, &cfg.AdminSocket)
	f.StringEnv(&cfg.SandboxDir, "sandbox-dir", "OVERLAY_SANDBOX_DIR", defaultSandboxDir, "directory where the per-network namespaces are mounted (this instance's alone)")
	f.VarEnv(addrValue{&cfg.AdvertiseAddr}, "advertise-addr", "OVERLAY_ADVERTISE_ADDR", "this host's VTEP `address` (default: the address Docker reports for this node, else the default-route interface's)")
	f.VarEnv(envflag.Port(&cfg.VXLANPort), "vxlan-port", "OVERLAY_VXLAN_PORT", "UDP `port` of the VXLAN devices, the same on every node (default: the port the other nodes use, else Docker's swarm data-path port, else 4789; kept in the state database)")
	f.VarEnv(envflag.Level(&cfg.LogLevel), "log-level", "OVERLAY_LOG_LEVEL", "log `level`: debug, info, warn or error")
	f.VarEnv(gossipPortValue{&cfg.GossipPort}, "gossip-port", "OVERLAY_GOSSIP_PORT", "TCP and UDP `port` of the gossip control plane (Docker's own uses 7946); 0 runs without it")
	f.VarEnv(envflag.List(&cfg.Join), "join", "OVERLAY_JOIN", "comma-separated `host[:port]` seeds of the gossip cluster (on a swarm, Docker names the other nodes)")
	f.StringEnv(&cfg.NodeName, "node-name", "OVERLAY_NODE_NAME", "", "unique, stable name of this node in the gossip cluster (default <hostname>-<advertise address>)")
	f.StringEnv(&cfg.SecretFile, "secret-file", "OVERLAY_SECRET_FILE", "", "file holding the base64 32-byte cluster secret: authenticates and encrypts gossip, needed for encrypted networks")
	f.VarEnv(envflag.Duration(&cfg.DeadGrace), "dead-grace", "OVERLAY_DEAD_GRACE", "how long a failed node's endpoints are kept elsewhere (`duration`)")
	f.VarEnv(envflag.Duration(&cfg.RestartGrace), "restart-grace", "OVERLAY_RESTART_GRACE", "how long the endpoints of a node whose plugin is being restarted on purpose (disable, upgrade, set: it announces it) are kept elsewhere; at least the dead grace (`duration`)")
	f.VarEnv(envflag.Duration(&cfg.KeyRotation), "key-rotation", "OVERLAY_KEY_ROTATION", "interval between IPsec key generations (`duration`)")
	f.StringEnv(&cfg.DockerSocket, "docker-socket", "OVERLAY_DOCKER_SOCKET", "", "Docker engine API socket, asked for the swarm's nodes so gossip needs no --join")
	f.StringEnv(&cfg.DockerNetnsDir, "docker-netns-dir", "OVERLAY_DOCKER_NETNS_DIR", "", "where Docker's container namespaces (the directory of the SandboxKeys it passes) are mounted here, for service VIPs (default: the SandboxKeys as Docker gives them)")
	f.VarEnv(envflag.Duration(&cfg.ResyncPeriod), "resync-period", "OVERLAY_RESYNC_PERIOD", "how often every network's kernel state is compared with its peer table in full; drift is repaired sooner, on the kernel's change events (`duration`)")
	f.VarEnv(envflag.DurationOrOff(&cfg.ProbeInterval, time.Second), "probe-interval", "OVERLAY_PROBE_INTERVAL", "interval between data-path probes of each peer: VXLAN, ESP and path MTU, reported by `overlay-plugin check`, WARN lines and metrics; 0 turns them off (`duration`)")
	f.VarEnv(envflag.Bool(&cfg.VXLANFilter), "vxlan-filter", "OVERLAY_VXLAN_FILTER", "drop VXLAN of the plugin's networks from any source but the cluster's VTEPs; false is UNSAFE: anyone who reaches the VXLAN port can send into unencrypted networks")
	f.StringEnv(&cfg.MetricsAddr, "metrics-addr", "OVERLAY_METRICS_ADDR", "", "TCP `host:port` serving Prometheus metrics (default: only GET /metrics on the admin socket)")
	if err := f.ParseEnv(args, getenv); err != nil {
		return cfg, err
	}
	if cfg.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.MetricsAddr); err != nil {
			return cfg, envflag.Usagef("serve: --metrics-addr %q: %v", cfg.MetricsAddr, err)
		}
	}
	if cfg.SecretFile != "" && cfg.GossipPort == 0 {
		return cfg, envflag.Usagef("serve: --secret-file needs the gossip control plane (--gossip-port is 0)")
	}
	cfg.AdminSocket = admincli.Socket(cfg.StateDir, cfg.AdminSocket)
	for _, p := range []struct{ name, v string }{
		{"--socket", cfg.Socket}, {"--state-dir", cfg.StateDir}, {"--sandbox-dir", cfg.SandboxDir}, {"--admin-socket", cfg.AdminSocket},
	} {
		if p.v == "" {
			return cfg, envflag.Usagef("serve: %s must not be empty", p.name)
		}
	}
	for _, p := range []struct{ name, v string }{{"--socket", cfg.Socket}, {"--admin-socket", cfg.AdminSocket}} {
		if err := unixsock.CheckPath(p.v); err != nil {
			return cfg, envflag.Usagef("serve: %s: %v", p.name, err)
		}
	}
	return cfg, nil
}
