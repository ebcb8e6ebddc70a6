package encrypted

// Reading a host namespace's nftables state and kernel counters with nft
// and /proc, independently of the plugin's own report (its IPsec state
// through iproute2: testbed.Netns.XfrmStates and XfrmPolicies).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// nftJSON runs `nft -j ARGS` inside the namespace and returns its objects.
func nftJSON(ns *testbed.Netns, args ...string) ([]map[string]json.RawMessage, error) {
	out, err := ns.Exec(append([]string{"nft", "-j"}, args...)...)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, fmt.Errorf("nft -j %v: %w: %.300s", args, err, out)
	}
	return doc.Nftables, nil
}

// nftTables lists the namespace's tables as "family name".
func nftTables(ns *testbed.Netns) ([]string, error) {
	objs, err := nftJSON(ns, "list", "tables")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range objs {
		raw, ok := o["table"]
		if !ok {
			continue
		}
		var tb struct{ Family, Name string }
		if err := json.Unmarshal(raw, &tb); err != nil {
			return nil, err
		}
		out = append(out, tb.Family+" "+tb.Name)
	}
	return out, nil
}

// nftCounter sums the packet counters of the rules in one chain of the
// plugin's table: "input" counts the inbound plaintext VXLAN of encrypted
// VNIs it dropped, "guard" the outbound VXLAN no IPsec policy took.
func nftCounter(ns *testbed.Netns, chain string) (uint64, error) {
	objs, err := nftJSON(ns, "list", "chain", "inet", "overlay_plugin", chain)
	if err != nil {
		return 0, err
	}
	var sum uint64
	rules := 0
	for _, o := range objs {
		raw, ok := o["rule"]
		if !ok {
			continue
		}
		rules++
		var r struct {
			Expr []map[string]json.RawMessage `json:"expr"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return 0, err
		}
		for _, e := range r.Expr {
			if c, ok := e["counter"]; ok {
				var ctr struct{ Packets uint64 }
				if err := json.Unmarshal(c, &ctr); err != nil {
					return 0, err
				}
				sum += ctr.Packets
			}
		}
	}
	if rules == 0 {
		return 0, fmt.Errorf("nft: no rule in chain inet overlay_plugin %s of %s", chain, ns.Name)
	}
	return sum, nil
}

// xfrmStat reads the namespace's /proc/net/xfrm_stat (the kernel's IPsec
// error counters: XfrmOutNoStates, XfrmInNoStates, ...).
func xfrmStat(ns *testbed.Netns) (map[string]uint64, error) {
	out, err := ns.Exec("cat", "/proc/net/xfrm_stat")
	if err != nil {
		return nil, err
	}
	st := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				st[f[0]] = v
			}
		}
	}
	return st, nil
}

// statDelta lists the counters that grew from a to b.
func statDelta(a, b map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range b {
		if v > a[k] {
			d[k] = v - a[k]
		}
	}
	return d
}

// cutGossip drops the namespace's gossip traffic, both ways, until the
// returned function (idempotent) removes the rule.
func cutGossip(bed *testbed.Bed, ns *testbed.Netns) (uncut func() error, err error) {
	rules := fmt.Sprintf(`table inet test_gossip_cut {
	chain in { type filter hook input priority -300; tcp dport %[1]d drop; udp dport %[1]d drop; tcp sport %[1]d drop; udp sport %[1]d drop; }
	chain out { type filter hook output priority -300; tcp dport %[1]d drop; udp dport %[1]d drop; tcp sport %[1]d drop; udp sport %[1]d drop; }
}
`, gossipPort)
	file := filepath.Join(bed.Dir(), "gossip-cut-"+ns.Name+".nft")
	if err := os.WriteFile(file, []byte(rules), 0o600); err != nil {
		return nil, err
	}
	if _, err := ns.Exec("nft", "-f", file); err != nil {
		return nil, fmt.Errorf("cut gossip in %s: %w", ns.Name, err)
	}
	var (
		once   sync.Once
		delErr error
	)
	return func() error {
		once.Do(func() { _, delErr = ns.Exec("nft", "delete", "table", "inet", "test_gossip_cut") })
		return delErr
	}, nil
}
