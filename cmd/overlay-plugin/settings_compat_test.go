package main

import (
	"encoding/json"
	"io"
	"os"
	"reflect"
	"testing"
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
	if !reflect.DeepEqual(upgraded, fresh) {
		t.Errorf("an upgraded node's settings differ from a fresh install's:\nupgraded %+v\nfresh    %+v", upgraded, fresh)
	}
}
