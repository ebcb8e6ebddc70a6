package dockere2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// The plugin's VNIs; Docker's own start at 4096.
const vniMin, vniMax = 256, 4095

var reVXLANID = regexp.MustCompile(`\bvxlan id (\d+)\b`)

// pluginVXLANs are the lines of `ip -d -o link show type vxlan` whose VNI
// is the plugin's.
func pluginVXLANs(out string) []string {
	var left []string
	for l := range strings.SplitSeq(out, "\n") {
		if m := reVXLANID.FindStringSubmatch(l); m != nil {
			if v, _ := strconv.Atoi(m[1]); v >= vniMin && v <= vniMax {
				left = append(left, l)
			}
		}
	}
	return left
}

// Leftovers is what the plugin left on n's host: namespaces in its
// sandbox directory (and the VXLAN devices and remote FDB entries in
// them), VXLAN devices of its VNIs in the host namespace, xfrm states and
// policies, its nft table.
func (c *Check) Leftovers(n *Node) ([]string, error) {
	sbs, err := c.Sandboxes(n)
	if err != nil {
		return nil, err
	}
	var left []string
	for _, sb := range sbs {
		left = append(left, "sandbox namespace left: "+sb)
		out, _ := n.Host("nsenter", "--net="+sb, "ip", "-d", "-o", "link", "show", "type", "vxlan")
		for _, l := range pluginVXLANs(out) {
			left = append(left, "  vxlan in it: "+l)
		}
		left = append(left, prefixed("  fdb in it: ", c.remoteFDB(n, sb))...)
	}
	out, _ := n.Host("ip", "-d", "-o", "link", "show", "type", "vxlan")
	left = append(left, prefixed("vxlan device in host netns: ", pluginVXLANs(out))...)
	out, _ = n.Host("ip", "-s", "xfrm", "state", "list")
	states, err := testbed.ParseXfrmStates(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n, err)
	}
	for _, s := range states {
		left = append(left, fmt.Sprintf("xfrm state: %v -> %v %s spi 0x%08x", s.Src, s.Dst, s.Proto, s.SPI))
	}
	out, _ = n.Host("ip", "xfrm", "policy", "list")
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "src ") {
			left = append(left, "xfrm policy: "+l)
		}
	}
	out, _ = n.Host("nft", "list", "tables")
	for l := range strings.SplitSeq(out, "\n") {
		if strings.Contains(l, "overlay_plugin") {
			left = append(left, "nft: "+l)
		}
	}
	return left, nil
}

// remoteFDB are the remote FDB entries (with a dst) in sandbox sb on n.
func (c *Check) remoteFDB(n *Node, sb string) []string {
	out, _ := n.Host("nsenter", "--net="+sb, "bridge", "fdb", "show")
	var fdb []string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.Contains(l, " dst ") {
			fdb = append(fdb, l)
		}
	}
	return fdb
}

// RemoteFDB are the remote FDB entries in every sandbox of the plugin on n.
func (c *Check) RemoteFDB(n *Node) []string {
	sbs, _ := c.Sandboxes(n)
	var fdb []string
	for _, sb := range sbs {
		fdb = append(fdb, c.remoteFDB(n, sb)...)
	}
	return fdb
}

// NoLeftovers waits up to limit until Leftovers finds nothing on n.
func (c *Check) NoLeftovers(n *Node, limit time.Duration) error {
	end := time.Now().Add(limit)
	for {
		left, err := c.Leftovers(n)
		if err == nil && len(left) == 0 {
			c.T.Logf("%s: no sandbox, VXLAN device, FDB entry, xfrm state or policy, nor nft table left", n)
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s, %v after the network was removed: %s (%v)", n, limit, strings.Join(left, "; "), err)
		}
		time.Sleep(time.Second)
	}
}

// RemoveLeavingNothing removes what the check made; network net must be
// gone and nothing of the plugin left on any host within limit.
func (c *Check) RemoveLeavingNothing(net string, limit time.Duration) {
	c.remove()
	if _, err := c.manager().Docker("network", "inspect", net); err == nil {
		c.T.Errorf("network rm %s failed", net)
	}
	for _, n := range c.Nodes {
		if err := c.NoLeftovers(n, limit); err != nil {
			c.T.Error(err)
		}
	}
}

func prefixed(p string, ls []string) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = p + l
	}
	return out
}
