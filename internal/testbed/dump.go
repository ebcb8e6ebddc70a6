package testbed

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Dump is every host's /v1/cluster, /v1/networks, UDP counters and plugin
// log tail, for failure messages.
func (c *Cluster) Dump() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "\n===== %s (underlay %s, pid %d, running=%v)\n", n.Name, n.Underlay, n.Plugin.Pid(), n.Plugin.Running())
		if n.Plugin.Running() {
			for _, path := range []string{"/v1/cluster", "/v1/networks"} {
				body, err := n.Plugin.AdminGet(path)
				if err != nil {
					fmt.Fprintf(&b, "--- GET %s: %v\n", path, err)
					continue
				}
				var v any
				if json.Unmarshal(body, &v) == nil {
					if pretty, err := json.MarshalIndent(v, "", "  "); err == nil {
						body = pretty
					}
				}
				fmt.Fprintf(&b, "--- GET %s:\n%s\n", path, body)
			}
		}
		if udp, err := n.UDPCounters(); err == nil {
			fmt.Fprintf(&b, "--- UDP counters in %s: %s\n", n.Name, udp)
		}
		fmt.Fprintf(&b, "--- log tail %s:\n%s\n", n.Plugin.LogFile, n.Plugin.LogTail(40))
	}
	return b.String()
}

// UDPCounters returns the host namespace's UDP counters (from
// /proc/net/snmp): receive-buffer drops there would lose gossip.
func (h *Host) UDPCounters() (string, error) {
	out, err := h.NS.Exec("cat", "/proc/net/snmp")
	if err != nil {
		return "", err
	}
	var names, values []string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "Udp: "); ok {
			if names == nil {
				names = strings.Fields(rest)
			} else {
				values = strings.Fields(rest)
			}
		}
	}
	if len(names) == 0 || len(names) != len(values) {
		return "", fmt.Errorf("no Udp lines in /proc/net/snmp of %s", h.Name)
	}
	var parts []string
	for i := range names {
		parts = append(parts, names[i]+"="+values[i])
	}
	return strings.Join(parts, " "), nil
}
