package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/unixsock"
)

// Defaults of the serve settings.
const (
	defaultSocket     = "/run/docker/plugins/overlay.sock"
	defaultStateDir   = "/var/lib/overlay-plugin"
	defaultSandboxDir = "/run/overlay-plugin/netns"
	defaultVXLANPort  = 4789
	// Docker's NetworkDB gossips on 7946; ours must differ.
	defaultGossipPort = 7947
	defaultDeadGrace  = 30 * time.Second
	// defaultRestartGrace must equal plugin/config.json's value: a plugin
	// upgraded from 0.1.0 keeps 0.1.0's env list, which lacks
	// OVERLAY_RESTART_GRACE, so this default is what applies there
	// (TestConfigJSONEnvDefaults).
	defaultRestartGrace = 10 * time.Minute
	defaultKeyRotation  = time.Hour
	adminSocketName     = "admin.sock"
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
}

// usageError is a bad command line or environment: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// envFlags is a flag set whose flags may take their value from an
// environment variable: a flag on the command line wins over the variable,
// the variable over the default. Docker passes a managed plugin's settings
// as environment variables. An empty variable counts as unset.
type envFlags struct {
	fs   *flag.FlagSet
	envs map[string]string // flag name -> variable
}

func newEnvFlags(name, synopsis string, out io.Writer) *envFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	f := &envFlags{fs: fs, envs: map[string]string{}}
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: overlay-plugin %s\n\nflags (a flag wins over its environment variable):\n", synopsis)
		fs.PrintDefaults()
	}
	return f
}

func (f *envFlags) stringVar(p *string, name, env, def, usage string) {
	f.envs[name] = env
	f.fs.StringVar(p, name, def, usage+" (env "+env+")")
}

func (f *envFlags) value(v flag.Value, name, env, usage string) {
	f.envs[name] = env
	f.fs.Var(v, name, usage+" (env "+env+")")
}

// parse applies the environment, then args. A bad variable is a usage error
// naming it. It returns flag.ErrHelp for -h.
func (f *envFlags) parse(args []string, getenv func(string) string) error {
	var errs []error
	f.fs.VisitAll(func(fl *flag.Flag) {
		env, ok := f.envs[fl.Name]
		if !ok {
			return
		}
		if v := getenv(env); v != "" {
			if err := fl.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q (--%s): %v", env, v, fl.Name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return usageError{err}
	}
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err} // the flag package has printed the usage
	}
	if f.fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", f.fs.Name(), f.fs.Arg(0))
	}
	return nil
}

// portValue is a UDP port, 1..65535.
type portValue struct{ p *uint16 }

func (v portValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(int(*v.p))
}

func (v portValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return errors.New("want a UDP port number between 1 and 65535")
	}
	*v.p = uint16(n)
	return nil
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

// listValue is a comma-separated list; empty items are dropped.
type listValue struct{ l *[]string }

func (v listValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.Join(*v.l, ",")
}

func (v listValue) Set(s string) error {
	*v.l = nil
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*v.l = append(*v.l, item)
		}
	}
	return nil
}

// durationValue is a positive duration.
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return errors.New("want a positive duration such as 30s or 1h")
	}
	*v.d = d
	return nil
}

// levelValue is a log level by name.
type levelValue struct{ l *slog.Level }

func (v levelValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.ToLower(v.l.String())
}

func (v levelValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		*v.l = slog.LevelDebug
	case "info":
		*v.l = slog.LevelInfo
	case "warn", "warning":
		*v.l = slog.LevelWarn
	case "error":
		*v.l = slog.LevelError
	default:
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

// adminFlags registers --state-dir and --admin-socket, shared by serve and
// the client subcommands so that both find the same socket.
func adminFlags(f *envFlags, stateDir, adminSocket *string) {
	f.stringVar(stateDir, "state-dir", "OVERLAY_STATE_DIR", defaultStateDir, "directory of the plugin's state (state.db, admin.sock)")
	f.stringVar(adminSocket, "admin-socket", "OVERLAY_ADMIN_SOCKET", "", "admin API socket (default <state-dir>/"+adminSocketName+")")
}

func resolveAdminSocket(stateDir, adminSocket string) string {
	if adminSocket != "" {
		return adminSocket
	}
	return filepath.Join(stateDir, adminSocketName)
}

// parseServeConfig reads serve's settings from args and the environment.
func parseServeConfig(args []string, getenv func(string) string, out io.Writer) (serveConfig, error) {
	cfg := serveConfig{VXLANPort: defaultVXLANPort, LogLevel: slog.LevelInfo, GossipPort: defaultGossipPort,
		DeadGrace: defaultDeadGrace, RestartGrace: defaultRestartGrace, KeyRotation: defaultKeyRotation, ResyncPeriod: driver.DefaultResyncPeriod}
	f := newEnvFlags("serve", "serve [flags]\n\nServe Docker's network driver API and the admin API until SIGTERM or SIGINT.", out)
	f.stringVar(&cfg.Socket, "socket", "OVERLAY_SOCKET", defaultSocket, "unix socket of Docker's network driver API")
	adminFlags(f, &cfg.StateDir, &cfg.AdminSocket)
	f.stringVar(&cfg.SandboxDir, "sandbox-dir", "OVERLAY_SANDBOX_DIR", defaultSandboxDir, "directory where the per-network namespaces are mounted (this instance's alone)")
	f.value(addrValue{&cfg.AdvertiseAddr}, "advertise-addr", "OVERLAY_ADVERTISE_ADDR", "this host's VTEP `address` (default: the address Docker reports for this node, else the default-route interface's)")
	f.value(portValue{&cfg.VXLANPort}, "vxlan-port", "OVERLAY_VXLAN_PORT", "UDP `port` of the VXLAN devices")
	f.value(levelValue{&cfg.LogLevel}, "log-level", "OVERLAY_LOG_LEVEL", "log `level`: debug, info, warn or error")
	f.value(gossipPortValue{&cfg.GossipPort}, "gossip-port", "OVERLAY_GOSSIP_PORT", "TCP and UDP `port` of the gossip control plane (Docker's own uses 7946); 0 runs without it")
	f.value(listValue{&cfg.Join}, "join", "OVERLAY_JOIN", "comma-separated `host[:port]` seeds of the gossip cluster (on a swarm, Docker names the other nodes)")
	f.stringVar(&cfg.NodeName, "node-name", "OVERLAY_NODE_NAME", "", "unique, stable name of this node in the gossip cluster (default <hostname>-<advertise address>)")
	f.stringVar(&cfg.SecretFile, "secret-file", "OVERLAY_SECRET_FILE", "", "file holding the base64 32-byte cluster secret: authenticates and encrypts gossip, needed for encrypted networks")
	f.value(durationValue{&cfg.DeadGrace}, "dead-grace", "OVERLAY_DEAD_GRACE", "how long a failed node's endpoints are kept elsewhere (`duration`)")
	f.value(durationValue{&cfg.RestartGrace}, "restart-grace", "OVERLAY_RESTART_GRACE", "how long the endpoints of a node whose plugin is being restarted on purpose (disable, upgrade, set: it announces it) are kept elsewhere; at least the dead grace (`duration`)")
	f.value(durationValue{&cfg.KeyRotation}, "key-rotation", "OVERLAY_KEY_ROTATION", "interval between IPsec key generations (`duration`)")
	f.stringVar(&cfg.DockerSocket, "docker-socket", "OVERLAY_DOCKER_SOCKET", "", "Docker engine API socket, asked for the swarm's nodes so gossip needs no --join")
	f.stringVar(&cfg.DockerNetnsDir, "docker-netns-dir", "OVERLAY_DOCKER_NETNS_DIR", "", "where Docker's container namespaces (the directory of the SandboxKeys it passes) are mounted here, for service VIPs (default: the SandboxKeys as Docker gives them)")
	f.value(durationValue{&cfg.ResyncPeriod}, "resync-period", "OVERLAY_RESYNC_PERIOD", "how often every network's kernel state is compared with its peer table in full; drift is repaired sooner, on the kernel's change events (`duration`)")
	f.stringVar(&cfg.MetricsAddr, "metrics-addr", "OVERLAY_METRICS_ADDR", "", "TCP `host:port` serving Prometheus metrics (default: only GET /metrics on the admin socket)")
	if err := f.parse(args, getenv); err != nil {
		return cfg, err
	}
	if cfg.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.MetricsAddr); err != nil {
			return cfg, usagef("serve: --metrics-addr %q: %v", cfg.MetricsAddr, err)
		}
	}
	if cfg.SecretFile != "" && cfg.GossipPort == 0 {
		return cfg, usagef("serve: --secret-file needs the gossip control plane (--gossip-port is 0)")
	}
	cfg.AdminSocket = resolveAdminSocket(cfg.StateDir, cfg.AdminSocket)
	for _, p := range []struct{ name, v string }{
		{"--socket", cfg.Socket}, {"--state-dir", cfg.StateDir}, {"--sandbox-dir", cfg.SandboxDir}, {"--admin-socket", cfg.AdminSocket},
	} {
		if p.v == "" {
			return cfg, usagef("serve: %s must not be empty", p.name)
		}
	}
	for _, p := range []struct{ name, v string }{{"--socket", cfg.Socket}, {"--admin-socket", cfg.AdminSocket}} {
		if err := unixsock.CheckPath(p.v); err != nil {
			return cfg, usagef("serve: %s: %v", p.name, err)
		}
	}
	return cfg, nil
}
