package dockere2e

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// mountSource is the host directory of the plugin's mount name on n (its
// settable source).
func (c *Check) mountSource(n *Node, name string) (string, error) {
	src, err := n.Docker("plugin", "inspect", "-f",
		fmt.Sprintf(`{{range .Settings.Mounts}}{{if eq .Name %q}}{{.Source}}{{end}}{{end}}`, name), c.Plugin)
	if err == nil && src == "" {
		err = fmt.Errorf("%s: plugin %s has no mount %q", n, c.Plugin, name)
	}
	return src, err
}

// StateDir is the plugin's state directory (state.db, admin.sock) as seen
// on n's host: overlay-plugin in the host's /var/lib (the 'var-lib' mount).
func (c *Check) StateDir(n *Node) (string, error) {
	src, err := c.mountSource(n, "var-lib")
	return src + "/overlay-plugin", err
}

// SandboxDir is the plugin's sandbox directory on n's host:
// overlay-plugin/netns in the host's /run (the 'run' mount).
func (c *Check) SandboxDir(n *Node) (string, error) {
	src, err := c.mountSource(n, "run")
	return src + "/overlay-plugin/netns", err
}

// PluginCLI runs `overlay-plugin ARGS --state-dir DIR` on n's host, against
// its plugin's admin socket.
func (c *Check) PluginCLI(n *Node, args ...string) (string, error) {
	if c.Env.PluginCLI == "" {
		return "", fmt.Errorf("%s is unset", envPluginCLI)
	}
	dir, err := c.StateDir(n)
	if err != nil {
		return "", err
	}
	return n.Host(append(append([]string{c.Env.PluginCLI}, args...), "--state-dir", dir)...)
}

// State is the plugin's `overlay-plugin state` on n.
func (c *Check) State(n *Node) ([]driver.NetworkState, string, error) {
	out, err := c.PluginCLI(n, "state")
	if err != nil {
		return nil, out, err
	}
	var st []driver.NetworkState
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, out, fmt.Errorf("%s: overlay-plugin state: %w", n, err)
	}
	return st, out, nil
}

// NetworkState is the plugin's account of network name on n (the name
// looked up on the manager: a worker knows a swarm network only while it
// runs a task on it).
func (c *Check) NetworkState(n *Node, name string) (driver.NetworkState, error) {
	id, err := c.manager().Docker("network", "inspect", "-f", "{{.Id}}", name)
	if err != nil {
		return driver.NetworkState{}, err
	}
	st, _, err := c.State(n)
	if err != nil {
		return driver.NetworkState{}, err
	}
	for _, s := range st {
		if s.ID == id {
			return s, nil
		}
	}
	return driver.NetworkState{}, fmt.Errorf("%s: overlay-plugin state has no network %s (%s)", n, name, id)
}

// Encryption is the plugin's `overlay-plugin encryption` on n.
func (c *Check) Encryption(n *Node) (encryption.Status, error) {
	var st encryption.Status
	out, err := c.PluginCLI(n, "encryption")
	if err == nil {
		err = json.Unmarshal([]byte(out), &st)
	}
	return st, err
}

// Metrics are the plugin's Prometheus metrics on n, read on its host
// through the admin socket.
func (c *Check) Metrics(n *Node) (string, error) {
	dir, err := c.StateDir(n)
	if err != nil {
		return "", err
	}
	return n.Host("curl", "-sf", "--unix-socket", dir+"/admin.sock", "http://plugin/metrics")
}

// Sandboxes are the networks' namespace files in the plugin's sandbox
// directory on n's host; HealthSandboxes those of its data-path probes'
// endpoints, in its subdirectory health, there while the plugin runs.
func (c *Check) Sandboxes(n *Node) ([]string, error) {
	dir, err := c.SandboxDir(n)
	if err != nil {
		return nil, err
	}
	out, err := n.Host("find", dir, "-mindepth", "1", "-maxdepth", "1", "-not", "-name", "health")
	return strings.Fields(out), err
}

func (c *Check) HealthSandboxes(n *Node) ([]string, error) {
	dir, err := c.SandboxDir(n)
	if err != nil {
		return nil, err
	}
	out, err := n.Host("find", dir+"/health", "-mindepth", "1")
	if err != nil && strings.Contains(out, "No such file") {
		return nil, nil
	}
	return strings.Fields(out), err
}
