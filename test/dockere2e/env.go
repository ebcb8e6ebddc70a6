package dockere2e

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// The environment scripts/e2e/lib.sh (e2e_go_env) sets for the test binary.
const (
	// envDocker lists each node's docker CLI invocation, one a line,
	// manager first (e.g. "/usr/bin/docker -H unix:///run/oe1-n1.sock").
	envDocker = "E2E_NODE_DOCKER"
	// envHostx lists, one a line, each node's command prefix that runs a
	// command on its host (e.g. "nsenter -t PID -m -n -u --"): the
	// command's words are appended (over ssh, they must need no quoting).
	envHostx = "E2E_NODE_HOSTX"
	// envWireNetns and envWireIf: the namespace and the bridge every node's
	// underlay traffic crosses; unset, the wire goes unwatched.
	envWireNetns = "E2E_WIRE_NETNS"
	envWireIf    = "E2E_WIRE_IF"
	// envNodeLogs lists, one a line, files holding each node's dockerd
	// log (with the plugin's lines), written just before the test.
	envNodeLogs = "E2E_NODE_LOGS"
	// envPluginCLI: bin/overlay-plugin, run on the nodes' hosts against the
	// plugin's admin socket.
	envPluginCLI = "E2E_PLUGIN_CLI"
)

// Env is the swarm under test.
type Env struct {
	Nodes  []*Node
	Plugin string // the installed plugin's name, what network create -d takes
	Image  string // a busybox image present on every node
	// ExpectESP: the kernel has ESP and encrypted networks must work;
	// otherwise they must be refused with an error naming what is missing.
	ExpectESP   bool
	TaskTimeout time.Duration
	// TimeScale stretches every other wait (the emulated VM's is larger).
	TimeScale         int
	WireNetns, WireIf string
	PluginCLI         string
}

var (
	envOnce sync.Once
	envVal  *Env
	envErr  error
)

// Setup returns the swarm, or skips t with why there is none here.
func Setup(t *testing.T) *Env {
	t.Helper()
	envOnce.Do(func() {
		if envVal, envErr = readEnv(); envErr != nil {
			fmt.Printf("dockere2e: SKIP all tests: %v\n", envErr)
		}
	})
	if envErr != nil {
		if testbed.Required("dockere2e") {
			t.Fatalf("no Docker e2e environment, and %s requires it: %v", testbed.RequireEnv, envErr)
		}
		t.Skipf("no Docker e2e environment (scripts/e2e-docker.sh sets it): %v", envErr)
	}
	return envVal
}

func readEnv() (*Env, error) {
	clis := lines(os.Getenv(envDocker))
	if len(clis) == 0 {
		return nil, fmt.Errorf("%s is unset", envDocker)
	}
	hostx := lines(os.Getenv(envHostx))
	e := &Env{
		Plugin:    os.Getenv("E2E_PLUGIN"),
		Image:     cmp.Or(os.Getenv("E2E_IMAGE"), "local/busybox:1"),
		ExpectESP: os.Getenv("E2E_EXPECT_ESP") == "1",
		WireNetns: os.Getenv(envWireNetns), WireIf: os.Getenv(envWireIf),
		PluginCLI: os.Getenv(envPluginCLI),
		TimeScale: atoi(os.Getenv("E2E_TIME_SCALE"), 1),
	}
	e.TaskTimeout = time.Duration(atoi(os.Getenv("E2E_TASK_TIMEOUT"), 90)) * time.Second
	if e.Plugin == "" {
		return nil, fmt.Errorf("E2E_PLUGIN is unset")
	}
	for i, cli := range clis {
		n := &Node{Index: i, env: e, docker: strings.Fields(cli)}
		if i < len(hostx) {
			n.hostx = strings.Fields(hostx[i])
		}
		e.Nodes = append(e.Nodes, n)
	}
	return e, nil
}

// Scaled is d times the environment's time scale.
func (e *Env) Scaled(d time.Duration) time.Duration { return d * time.Duration(e.TimeScale) }

// HaveHostx reports whether every node's host can be inspected.
func (e *Env) HaveHostx() bool {
	for _, n := range e.Nodes {
		if len(n.hostx) == 0 {
			return false
		}
	}
	return true
}

func lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func atoi(s string, def int) int {
	if v, err := strconv.Atoi(s); err == nil && v > 0 {
		return v
	}
	return def
}
