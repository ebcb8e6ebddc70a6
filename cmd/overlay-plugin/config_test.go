package main

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/internal/envflag"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestServeConfigPrecedence(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		want      serveConfig
		filterOff bool
	}{
		{
			name: "defaults",
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir,
				AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo},
		},
		{
			name: "probes off, by environment",
			env:  map[string]string{"OVERLAY_PROBE_INTERVAL": "0"},
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir,
				AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo, ProbeInterval: -1},
		},
		{
			name: "environment over defaults",
			env: map[string]string{"OVERLAY_SOCKET": "/e/p.sock", "OVERLAY_STATE_DIR": "/e/state", "OVERLAY_SANDBOX_DIR": "/e/netns",
				"OVERLAY_ADVERTISE_ADDR": "198.51.100.5", "OVERLAY_VXLAN_PORT": "4790", "OVERLAY_LOG_LEVEL": "debug"},
			want: serveConfig{Socket: "/e/p.sock", StateDir: "/e/state", SandboxDir: "/e/netns", AdminSocket: "/e/state/admin.sock",
				AdvertiseAddr: netip.MustParseAddr("198.51.100.5"), VXLANPort: 4790, LogLevel: slog.LevelDebug},
		},
		{
			name: "flags over environment",
			args: []string{"--socket", "/f/p.sock", "--state-dir=/f/state", "-sandbox-dir", "/f/netns", "--admin-socket", "/f/a.sock",
				"--advertise-addr", "2001:db8::1", "--vxlan-port", "4791", "--log-level", "WARN"},
			env: map[string]string{"OVERLAY_SOCKET": "/e/p.sock", "OVERLAY_STATE_DIR": "/e/state", "OVERLAY_SANDBOX_DIR": "/e/netns",
				"OVERLAY_ADMIN_SOCKET": "/e/a.sock", "OVERLAY_ADVERTISE_ADDR": "198.51.100.5", "OVERLAY_VXLAN_PORT": "4790", "OVERLAY_LOG_LEVEL": "debug"},
			want: serveConfig{Socket: "/f/p.sock", StateDir: "/f/state", SandboxDir: "/f/netns", AdminSocket: "/f/a.sock",
				AdvertiseAddr: netip.MustParseAddr("2001:db8::1"), VXLANPort: 4791, LogLevel: slog.LevelWarn},
		},
		{
			name: "admin socket follows the state dir given by flag",
			args: []string{"--state-dir", "/f/state"},
			env:  map[string]string{"OVERLAY_STATE_DIR": "/e/state"},
			want: serveConfig{Socket: defaultSocket, StateDir: "/f/state", SandboxDir: defaultSandboxDir, AdminSocket: "/f/state/admin.sock",
				LogLevel: slog.LevelInfo},
		},
		{
			name: "admin socket from the environment beats the derived one",
			args: []string{"--state-dir", "/f/state"},
			env:  map[string]string{"OVERLAY_ADMIN_SOCKET": "/e/a.sock"},
			want: serveConfig{Socket: defaultSocket, StateDir: "/f/state", SandboxDir: defaultSandboxDir, AdminSocket: "/e/a.sock",
				LogLevel: slog.LevelInfo},
		},
		{
			name: "gossip, encryption and resync settings",
			args: []string{"--join", "198.51.100.1, 198.51.100.2:8000,", "--node-name", "h2", "--dead-grace", "3s"},
			env: map[string]string{"OVERLAY_GOSSIP_PORT": "8000", "OVERLAY_SECRET_FILE": "/etc/overlay-plugin/secret",
				"OVERLAY_KEY_ROTATION": "10m", "OVERLAY_JOIN": "ignored", "OVERLAY_RESYNC_PERIOD": "5s", "OVERLAY_RESTART_GRACE": "90s"},
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir,
				AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo,
				GossipPort: 8000, Join: []string{"198.51.100.1", "198.51.100.2:8000"}, NodeName: "h2",
				SecretFile: "/etc/overlay-plugin/secret", DeadGrace: 3 * time.Second, KeyRotation: 10 * time.Minute,
				ResyncPeriod: 5 * time.Second, RestartGrace: 90 * time.Second},
		},
		{
			name: "restart grace by flag",
			args: []string{"--restart-grace", "1m"},
			env:  map[string]string{"OVERLAY_RESTART_GRACE": "2m"},
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir,
				AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo, RestartGrace: time.Minute},
		},
		{
			name:      "source filter off by flag",
			args:      []string{"--vxlan-filter=false"},
			env:       map[string]string{"OVERLAY_VXLAN_FILTER": "true"},
			want:      serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir, AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo},
			filterOff: true,
		},
		{
			name:      "source filter off by environment",
			env:       map[string]string{"OVERLAY_VXLAN_FILTER": "0"},
			want:      serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir, AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo},
			filterOff: true,
		},
		{
			name: "the source filter flag alone turns it on",
			args: []string{"--vxlan-filter"},
			env:  map[string]string{"OVERLAY_VXLAN_FILTER": "false"},
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir, AdminSocket: "/var/lib/overlay-plugin/admin.sock", LogLevel: slog.LevelInfo},
		},
		{
			name: "empty variables count as unset; mapped IPv4 is unmapped",
			args: []string{"--advertise-addr", "::ffff:198.51.100.9"},
			env:  map[string]string{"OVERLAY_SOCKET": "", "OVERLAY_VXLAN_PORT": ""},
			want: serveConfig{Socket: defaultSocket, StateDir: defaultStateDir, SandboxDir: defaultSandboxDir,
				AdminSocket: "/var/lib/overlay-plugin/admin.sock", AdvertiseAddr: netip.MustParseAddr("198.51.100.9"), LogLevel: slog.LevelInfo},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			got, err := parseServeConfig(c.args, envOf(c.env), &out)
			if err != nil {
				t.Fatalf("error %v (%s)", err, out.String())
			}
			want := c.want
			if want.GossipPort == 0 && want.DeadGrace == 0 {
				want.GossipPort, want.DeadGrace, want.KeyRotation = defaultGossipPort, defaultDeadGrace, defaultKeyRotation
			}
			if want.ResyncPeriod == 0 {
				want.ResyncPeriod = driver.DefaultResyncPeriod
			}
			if want.RestartGrace == 0 {
				want.RestartGrace = defaultRestartGrace
			}
			want.VXLANFilter = !c.filterOff
			switch want.ProbeInterval {
			case 0:
				want.ProbeInterval = health.Interval
			case -1: // off
				want.ProbeInterval = 0
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestServeConfigErrors(t *testing.T) {
	long := "/" + strings.Repeat("x", 120) + ".sock"
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string // in the message
	}{
		{"bad port in env", nil, map[string]string{"OVERLAY_VXLAN_PORT": "abc"}, []string{"OVERLAY_VXLAN_PORT", `"abc"`, "UDP port"}},
		{"port 0 in env", nil, map[string]string{"OVERLAY_VXLAN_PORT": "0"}, []string{"OVERLAY_VXLAN_PORT"}},
		{"secret without gossip", []string{"--gossip-port", "0", "--secret-file", "/s"}, nil, []string{"--secret-file", "gossip"}},
		{"bad grace", nil, map[string]string{"OVERLAY_DEAD_GRACE": "soon"}, []string{"OVERLAY_DEAD_GRACE", "duration"}},
		{"probes too often", []string{"--probe-interval", "500ms"}, nil, []string{"probe-interval", "0 (off) or a duration of at least 1s"}},
		{"resync period 0", []string{"--resync-period", "0s"}, nil, []string{"resync-period", "positive duration"}},
		{"bad gossip port", []string{"--gossip-port", "70000"}, nil, []string{"gossip-port"}},
		{"port too big in env", nil, map[string]string{"OVERLAY_VXLAN_PORT": "70000"}, []string{"OVERLAY_VXLAN_PORT"}},
		{"bad level in env", nil, map[string]string{"OVERLAY_LOG_LEVEL": "loud"}, []string{"OVERLAY_LOG_LEVEL", "debug, info, warn or error"}},
		{"bad address in env", nil, map[string]string{"OVERLAY_ADVERTISE_ADDR": "host.example"}, []string{"OVERLAY_ADVERTISE_ADDR", "IPv4 or IPv6"}},
		{"unspecified address in env", nil, map[string]string{"OVERLAY_ADVERTISE_ADDR": "0.0.0.0"}, []string{"OVERLAY_ADVERTISE_ADDR", "cannot be a VTEP"}},
		{"two bad variables", nil, map[string]string{"OVERLAY_LOG_LEVEL": "loud", "OVERLAY_VXLAN_PORT": "x"}, []string{"OVERLAY_LOG_LEVEL", "OVERLAY_VXLAN_PORT"}},
		// A bad variable is an error even when a flag would override it:
		// the setting is wrong either way.
		{"bad env under a good flag", []string{"--vxlan-port", "4789"}, map[string]string{"OVERLAY_VXLAN_PORT": "x"}, []string{"OVERLAY_VXLAN_PORT"}},
		{"bad flag value", []string{"--vxlan-port", "x"}, nil, []string{"vxlan-port"}},
		{"bad source filter switch", nil, map[string]string{"OVERLAY_VXLAN_FILTER": "maybe"}, []string{"OVERLAY_VXLAN_FILTER", "true or false"}},
		{"bad metrics address", []string{"--metrics-addr", "9547"}, nil, []string{"--metrics-addr", `"9547"`}},
		{"unknown flag", []string{"--colour", "blue"}, nil, []string{"colour"}},
		{"extra argument", []string{"now"}, nil, []string{`unexpected argument "now"`}},
		{"empty socket", []string{"--socket", ""}, nil, []string{"--socket must not be empty"}},
		{"socket path too long", []string{"--socket", long}, nil, []string{"--socket", "at most 93"}},
		{"admin socket path too long", nil, map[string]string{"OVERLAY_ADMIN_SOCKET": long}, []string{"--admin-socket", "at most 93"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := parseServeConfig(c.args, envOf(c.env), &out)
			var ue envflag.UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("error %v, want a usage error", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}

	var out bytes.Buffer
	if _, err := parseServeConfig([]string{"-h"}, envOf(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	for _, w := range []string{"-socket", "OVERLAY_SOCKET", "OVERLAY_STATE_DIR", "OVERLAY_SANDBOX_DIR", "OVERLAY_ADMIN_SOCKET",
		"OVERLAY_ADVERTISE_ADDR", "OVERLAY_VXLAN_PORT", "OVERLAY_LOG_LEVEL", "Docker's swarm data-path port, else 4789", "(default info)", "-vxlan-port port"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("serve -h does not mention %q:\n%s", w, out.String())
		}
	}
}

func TestRunCommandLine(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		env    map[string]string
		status int
		stdout string // substring
		stderr string // substring
	}{
		{"no arguments", nil, nil, 2, "", "commands:"},
		{"help", []string{"-h"}, nil, 0, "peer add", ""},
		{"help word", []string{"help"}, nil, 0, "serve", ""},
		{"version", []string{"version"}, nil, 0, "overlay-plugin dev (commit unknown)\n", ""},
		{"version with argument", []string{"version", "x"}, nil, 2, "", "no arguments"},
		{"unknown command", []string{"frob"}, nil, 2, "", `unknown command "frob"`},
		{"serve bad env", []string{"serve"}, map[string]string{"OVERLAY_LOG_LEVEL": "loud"}, 2, "", "OVERLAY_LOG_LEVEL"},
		{"serve help", []string{"serve", "-h"}, nil, 0, "", "OVERLAY_SOCKET"},
		{"peer alone", []string{"peer"}, nil, 2, "", "missing subcommand"},
		{"peer unknown", []string{"peer", "frob"}, nil, 2, "", `unknown subcommand "frob"`},
		{"peer add missing", []string{"peer", "add", "--network", "n1"}, nil, 2, "", "missing --endpoint, --mac, --vtep, --ip"},
		{"peer add bad ip", []string{"peer", "add", "--ip", "x"}, nil, 2, "", "-ip"},
		{"peer add bad mac", []string{"peer", "add", "--network", "n", "--endpoint", "e", "--ip", "203.0.113.1", "--mac", "zz", "--vtep", "198.51.100.1"}, nil, 2, "", "--mac"},
		{"peer add bad vtep", []string{"peer", "add", "--network", "n", "--endpoint", "e", "--ip", "203.0.113.1", "--mac", "02:00:00:00:00:01", "--vtep", "h"}, nil, 2, "", "--vtep"},
		{"peer del missing", []string{"peer", "del", "--endpoint", "e"}, nil, 2, "", "missing --network"},
		{"peer del no plugin", []string{"peer", "del", "--network", "n", "--endpoint", "e", "--admin-socket", "/nonexistent/a.sock"}, nil, 1, "", "is the plugin running"},
		{"state no plugin", []string{"state"}, map[string]string{"OVERLAY_STATE_DIR": "/nonexistent"}, 1, "", "/nonexistent/admin.sock"},
		{"state extra argument", []string{"state", "x"}, nil, 2, "", "unexpected argument"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			status := run(c.args, envOf(c.env), &stdout, &stderr)
			if status != c.status {
				t.Errorf("status %d, want %d\nstdout: %s\nstderr: %s", status, c.status, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), c.stdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), c.stdout)
			}
			if !strings.Contains(stderr.String(), c.stderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), c.stderr)
			}
		})
	}
}
