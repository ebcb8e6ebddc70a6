package dockere2e

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The parsers of the tools' output run without the e2e environment.

func TestNslookupAnswers(t *testing.T) {
	out := `Server:		127.0.0.11
Address:	127.0.0.11:53

Non-authoritative answer:
Name:	tasks.web
Address: 203.0.113.35
Name:	tasks.web
Address: 203.0.113.34
Address: 203.0.113.35
`
	if got, want := nslookupAnswers(out), []string{"203.0.113.34", "203.0.113.35"}; !slices.Equal(got, want) {
		t.Errorf("nslookupAnswers = %v, want %v", got, want)
	}
	if got := nslookupAnswers("** server can't find x: NXDOMAIN\n"); len(got) != 0 {
		t.Errorf("nslookupAnswers of a failure = %v, want none", got)
	}
}

func TestPluginVXLANs(t *testing.T) {
	out := `7: vx-000100-abcde: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue master br0 state UNKNOWN mode DEFAULT group default \    link/ether 2a:aa:bb:cc:dd:ee brd ff:ff:ff:ff:ff:ff link-netnsid 0 promiscuity 1 minmtu 68 maxmtu 65535 \    vxlan id 256 srcport 0 0 dstport 4789 proxy l2miss l3miss ttl auto ageing 300
9: vxlan0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue master br0 state UNKNOWN \    vxlan id 4097 srcport 0 0 dstport 4789 proxy l2miss l3miss ttl auto ageing 300
`
	got := pluginVXLANs(out)
	if len(got) != 1 || !strings.HasPrefix(got[0], "7: ") {
		t.Errorf("pluginVXLANs = %q, want the VNI 256 device only (Docker's start at 4096)", got)
	}
}

// dockerd logs a plugin's line with the plugin's own quotes escaped.
func TestPortSettledInDockerdLog(t *testing.T) {
	for _, c := range []struct{ line, port, from string }{
		{`time="2026-12-05T11:34:02Z" level=info msg="time=2026-12-05T11:34:02.390Z level=INFO msg=\"VXLAN port settled\" port=4789 from=state follows_docker=true" plugin=` + strings.Repeat("a", 64),
			"4789", "state"},
		{`time="2026-12-05T11:34:02Z" level=info msg="time=2026-12-05T11:34:02.390Z level=INFO msg=\"VXLAN port settled\" port=5789 from=\"member node1-198.51.100.1\" follows_docker=true" plugin=` + strings.Repeat("a", 64),
			"5789", `\"member node1-198.51.100.1\"`},
	} {
		m := rePortSettled.FindStringSubmatch(c.line)
		if m == nil || m[1] != c.port || m[2] != c.from {
			t.Errorf("%q: %q, want port %s from %s", c.line, m, c.port, c.from)
		}
	}
}

// TestReadmeRollCommands: the swarm's roll of the cluster secret runs the
// README's commands, as the README has them.
func TestReadmeRollCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string // the README's lines without their indent (a list item's code block)
	for l := range strings.Lines(string(readme)) {
		lines = append(lines, strings.TrimLeft(l, " "))
	}
	text := strings.Join(lines, "")
	for i, cmd := range readmeRoll {
		if !strings.Contains(text, cmd+"\noverlay-plugin reload\n") {
			t.Errorf("step %d's commands, then overlay-plugin reload, are not in README.md as written here:\n%s", i+1, cmd)
		}
	}
}
