package dockere2e

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	rePluginLine = regexp.MustCompile(`plugin=[0-9a-f]{64}`)
	// dockerd's level and the plugin's (slog's format) of a plugin line.
	reLevels    = regexp.MustCompile(` level=([a-z]+) msg="time=[^ ]+ level=([A-Z]+)[-+0-9]* `)
	reStopError = regexp.MustCompile(`level=ERROR.*(use of closed network connection|operation was canceled|context canceled)`)
	// The plugin's VXLAN port as it settled it, inside dockerd's quoting.
	rePortSettled = regexp.MustCompile(`msg=\\"VXLAN port settled\\" port=([0-9]+) from=(\\"[^\\]*\\"|[^ ]+)`)
)

// TestCheckPluginLogs is check_plugin_logs, (g): the plugin's lines in
// dockerd's log carry the plugin's level (INFO and DEBUG on stdout, which
// dockerd logs at info; WARN and ERROR on stderr, at error), a plugin stop
// logs no ERROR (closed transport, cancelled dial), and no worker's dockerd
// was asked GET /nodes (it answers only on a manager, and logs every
// refusal as an error), and every node's plugin settled the VXLAN port of
// Docker's swarm data-path port, as the manager's engine says it (the
// worker's says none: it follows the members), with no WARN that they
// differ. Run last, so the plugin has been at it a while.
func TestCheckPluginLogs(t *testing.T) {
	c := Start(t)
	logs := lines(os.Getenv(envNodeLogs))
	if len(logs) != len(c.Nodes) {
		t.Fatalf("%s names %d dockerd logs for %d nodes", envNodeLogs, len(logs), len(c.Nodes))
	}
	dp, err := c.DataPathPort()
	if err != nil {
		t.Fatal(err)
	}
	dataPath := strconv.Itoa(int(dp))
	for i, n := range c.Nodes {
		b, err := os.ReadFile(logs[i])
		if err != nil {
			t.Fatal(err)
		}
		all := strings.Split(string(b), "\n")
		pairs := map[string]int{}
		var stopErrors []string
		for _, l := range all {
			if !rePluginLine.MatchString(l) {
				continue
			}
			if m := reLevels.FindStringSubmatch(l); m != nil {
				pairs[m[1]+" "+m[2]]++
			}
			if reStopError.MatchString(l) {
				stopErrors = append(stopErrors, l)
			}
		}
		var wrong []string
		for p, k := range pairs {
			if !slices.Contains([]string{"info DEBUG", "info INFO", "error WARN", "error ERROR"}, p) {
				wrong = append(wrong, fmt.Sprintf("%dx %s", k, p))
			}
		}
		switch {
		case pairs["info INFO"] == 0:
			t.Errorf("%s: no INFO line of the plugin logged by dockerd at level=info", n)
		case len(wrong) > 0:
			t.Errorf("%s: plugin lines at the wrong dockerd level (dockerd's, plugin's): %v", n, wrong)
		default:
			t.Logf("%s: plugin lines, each at its level (dockerd's/plugin's): %v", n, pairs)
		}
		if len(stopErrors) > 0 {
			t.Errorf("%s: %d plugin ERROR lines of a stop: %.200s", n, len(stopErrors), stopErrors[0])
		}
		// Each start's port; a node upgraded from 0.1.0 keeps its 4789
		// (its setting, or the rule for a node that ran 0.1.0), and warns
		// if the swarm's is another; the fresh
		// installs after it (the last start) follow the swarm's.
		var settled []string
		var last string
		differ := 0
		for _, l := range all {
			if m := rePortSettled.FindStringSubmatch(l); m != nil {
				settled, last = append(settled, m[1]+" from "+m[2]), m[1]
				if m[1] != dataPath {
					differ++
					if m[2] != "setting" && m[2] != `\"previous release\"` {
						t.Errorf("%s: the plugin settled VXLAN port %s (from %s), Docker's data-path port is %s", n, m[1], m[2], dataPath)
					}
				}
			}
			if strings.Contains(l, "VXLAN port differs from Docker") && differ == 0 {
				t.Errorf("%s: a WARN that the ports differ, while they did not: %.300s", n, l)
			}
		}
		switch {
		case len(settled) == 0:
			t.Errorf("%s: the plugin never logged its VXLAN port as settled", n)
		case last != dataPath:
			t.Errorf("%s: the plugin's last start settled VXLAN port %s, Docker's data-path port is %s", n, last, dataPath)
		default:
			t.Logf("%s: VXLAN port settled at each start: %v (Docker's data-path port %s)", n, settled, dataPath)
		}
		if mgr, _ := n.Docker("info", "-f", "{{.Swarm.ControlAvailable}}"); mgr == "true" {
			continue
		}
		var refused []string
		for _, l := range all {
			if strings.Contains(l, "not a swarm manager") {
				refused = append(refused, l)
			}
		}
		if len(refused) > 0 {
			t.Errorf("%s (a worker): dockerd logged %d 'not a swarm manager' errors: %.200s", n, len(refused), refused[0])
		} else {
			t.Logf("%s (a worker): no 'not a swarm manager' error in dockerd's log", n)
		}
	}
}
