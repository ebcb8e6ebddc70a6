// Package swarm measures the plugin on a real two-node Docker swarm (the
// one scripts/e2e/lib.sh builds in network namespaces, set up for it by
// scripts/bench-swarm.sh): docker run → reachable from the other node,
// cold and warm, and cross-host TCP throughput, each against Docker's
// built-in overlay driver (and the underlay itself for throughput) in the
// same run, interleaved.
//
// The measuring happens in this process: a goroutine locked to a thread
// that entered a container's (or a node's) network namespace creates the
// sockets there (inNetNS), so no tool has to be put into the image and the
// clocks of both ends are one monotonic clock. Nothing here adds an
// address, route or interface anywhere: the containers' own, made by the
// drivers, are used.
package swarm

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Node is one dockerd of the swarm.
type Node struct {
	Name string
	// CLI is the docker command line for this node's daemon
	// (docker -H unix:///run/<prefix>-n1.sock).
	CLI []string
	// NetNS is the path of the node's network namespace (the "host" of
	// the underlay), Addr its underlay address.
	NetNS string
	Addr  string
}

// Options configure both figures.
type Options struct {
	// Nodes: the manager first; containers that are measured start on
	// Nodes[1], the prober and the sender run on Nodes[0].
	Nodes []Node
	// Plugin is the plugin's driver name (overlay-plugin:latest); the
	// reference is Docker's "overlay".
	Plugin string
	Image  string
	Reps   int
	// ReachTimeout: how long a container may take to become reachable
	// before the run counts as failed.
	ReachTimeout time.Duration
	// ProbeEvery: a new TCP connection attempt this often (the reach
	// figure's resolution).
	ProbeEvery time.Duration
	// Streams: the throughput figure's parallel stream counts; Duration
	// how long each run sends.
	Streams  []int
	Duration time.Duration
	// WireNS and WireIf: where every byte Nodes[0] sends onto the
	// underlay is counted (the switch's port of node1); empty: not
	// checked.
	WireNS, WireIf string
	Progress       func(string)
}

// DefaultOptions are make bench's, nodes aside.
func DefaultOptions() Options {
	return Options{Plugin: "overlay-plugin:latest", Image: "local/busybox:1", Reps: 3,
		ReachTimeout: 60 * time.Second, ProbeEvery: 10 * time.Millisecond,
		Streams: []int{1, 4}, Duration: 5 * time.Second, Progress: func(string) {}}
}

// Systems: the plugin first, compared with the others.
const (
	sysPlugin   = "plugin"
	sysOverlay  = "overlay"
	sysUnderlay = "underlay"
)

func (o Options) driver(sys string) string {
	if sys == sysPlugin {
		return o.Plugin
	}
	return "overlay"
}

// docker runs the node's docker CLI with args and returns its trimmed
// standard output; its standard error is in the error.
func (n Node) docker(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.CLI[0], append(n.CLI[1:], args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: docker %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// createNetwork makes an attachable swarm-scope network on the manager.
func (o Options) createNetwork(sys, name, subnet string) error {
	_, err := o.Nodes[0].docker(time.Minute, "network", "create", "-d", o.driver(sys), "--scope", "swarm",
		"--attachable", "--subnet", subnet, name)
	return err
}

// removeNetwork removes the network on the manager once its containers are
// gone (a worker's copy can lag behind its last container by a moment).
func (o Options) removeNetwork(name string) error {
	if _, err := o.Nodes[0].docker(time.Minute, "network", "inspect", name); err != nil {
		return nil // never made
	}
	var err error
	for range 20 {
		if _, err = o.Nodes[0].docker(time.Minute, "network", "rm", name); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// container is one started container.
type container struct {
	node Node
	name string
	pid  int
}

// netns is the container's network namespace.
func (c container) netns() string { return fmt.Sprintf("/proc/%d/ns/net", c.pid) }

// run starts a container (docker run -d) with args after the image.
func (o Options) run(n Node, name, network, ip string, args ...string) (container, error) {
	a := append([]string{"run", "-d", "--name", name, "--hostname", name, "--network", network, "--ip", ip, o.Image}, args...)
	if _, err := n.docker(2*time.Minute, a...); err != nil {
		return container{}, err
	}
	return inspect(n, name)
}

func inspect(n Node, name string) (container, error) {
	out, err := n.docker(time.Minute, "inspect", "-f", "{{.State.Pid}}", name)
	if err != nil {
		return container{}, err
	}
	c := container{node: n, name: name}
	if _, err := fmt.Sscan(out, &c.pid); err != nil || c.pid <= 0 {
		return container{}, fmt.Errorf("%s: container %s has no process (pid %q)", n.Name, name, out)
	}
	return c, nil
}

// rm removes containers by name on node n, ignoring errors: also those
// whose docker run failed half way (scripts/e2e/lib.sh removes whatever
// is left at its cleanup).
func rm(n Node, names ...string) {
	if len(names) > 0 {
		n.docker(time.Minute, append([]string{"rm", "-f"}, names...)...)
	}
}
