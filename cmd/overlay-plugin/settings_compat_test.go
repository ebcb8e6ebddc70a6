package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// pluginEnv reads the env list of a managed plugin config.json: what
// Docker passes the plugin when nobody ran `docker plugin set`.
func pluginEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Env []struct {
			Name  string  `json:"name"`
			Value *string `json:"value"`
		} `json:"env"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.Value != nil {
			env[e.Name] = *e.Value
		}
	}
	return env
}

// `docker plugin upgrade` replaces the plugin's config but keeps its env
// settings: a node upgraded from 0.1.0 runs this binary with 0.1.0's env
// list (and whatever the operator set), without the variables added since.
// Its settings must come out exactly as a fresh install's: a variable new
// since then must default in the binary to its config.json value, and a
// default must not change under an upgraded node (it would keep the old).
func TestSettingsOfANodeUpgradedFromPrevious(t *testing.T) {
	prev := pluginEnv(t, "testdata/config-0.1.0.json")
	cur := pluginEnv(t, "../../plugin/config.json")
	for name := range prev {
		if _, ok := cur[name]; !ok {
			t.Errorf("%s of 0.1.0 is gone from plugin/config.json: an upgraded node's setting would be ignored", name)
		}
	}
	parse := func(env map[string]string) serveConfig {
		t.Helper()
		cfg, err := parseServeConfig(nil, func(k string) string { return env[k] }, io.Discard)
		if err != nil {
			t.Fatalf("settings %v: %v", env, err)
		}
		return cfg
	}
	upgraded, fresh := parse(prev), parse(cur)
	// The one default that changed on purpose: 0.1.0 set 4789, a fresh
	// install sets no port and follows the cluster (controlplane,
	// vxlanport.go). An upgraded node keeps 4789, which is also what the
	// rule for a node that ran 0.1.0 gives it, and a fresh node joining
	// its cluster takes the port the members use: the same port either way.
	if upgraded.VXLANPort != 4789 || fresh.VXLANPort != 0 {
		t.Errorf("VXLAN port: upgraded %d, fresh %d; want 4789 and 0 (follow the cluster)", upgraded.VXLANPort, fresh.VXLANPort)
	}
	upgraded.VXLANPort = 0
	if !reflect.DeepEqual(upgraded, fresh) {
		t.Errorf("an upgraded node's settings differ from a fresh install's:\nupgraded %+v\nfresh    %+v", upgraded, fresh)
	}
}

// TestConfigJSONEnvDefaults: every variable of plugin/config.json is a
// serve setting, and its value there gives the same configuration as the
// binary's default, but for the paths of the plugin's own mounts (which
// only exist inside the plugin; 0.1.0 had them, so an upgrade keeps them).
// So the plugin behaves the same whether or not Docker passes a variable,
// which it does not for variables added after the release first installed.
func TestConfigJSONEnvDefaults(t *testing.T) {
	env := pluginEnv(t, "../../plugin/config.json")
	prev := pluginEnv(t, "testdata/config-0.1.0.json")
	mounts := map[string]string{ // variable → the mount its value points into
		"OVERLAY_DOCKER_SOCKET":    "docker",
		"OVERLAY_DOCKER_NETNS_DIR": "run",
		"OVERLAY_SECRET_FILE":      "secrets",
	}
	var help bytes.Buffer
	if _, err := parseServeConfig([]string{"-h"}, envOf(nil), &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	def, err := parseServeConfig(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for name, value := range env {
		seen[name] = true
		if !strings.Contains(help.String(), "(env "+name+")") {
			t.Errorf("config.json sets %s, which no serve flag reads", name)
			continue
		}
		got, err := parseServeConfig(nil, envOf(map[string]string{name: value}), io.Discard)
		if err != nil {
			t.Errorf("%s=%q from config.json: %v", name, value, err)
			continue
		}
		same := reflect.DeepEqual(got, def)
		if mount, ok := mounts[name]; ok {
			if same {
				t.Errorf("%s: listed as pointing into the %q mount, but its value %q is the default: drop it from the list", name, mount, value)
			}
			if _, ok := prev[name]; !ok {
				t.Errorf("%s differs from the binary's default and was not in 0.1.0's config.json: an upgraded plugin would not get it", name)
			}
			continue
		}
		if !same {
			t.Errorf("%s=%q in config.json differs from the binary's default (%+v vs %+v): a plugin upgraded from a release without it runs the default",
				name, value, got, def)
		}
	}
	for _, name := range []string{"OVERLAY_DEAD_GRACE", "OVERLAY_RESTART_GRACE"} {
		if !seen[name] {
			t.Errorf("config.json lacks %s", name)
		}
	}
	if def.RestartGrace != 10*time.Minute {
		t.Errorf("default restart grace %v, want 10m (config.json's)", def.RestartGrace)
	}
}
