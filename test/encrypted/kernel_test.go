package encrypted

// Reading a host namespace's nftables state and kernel counters by
// netlink and /proc, independently of the plugin's own report (its IPsec
// state through iproute2: testbed.Netns.XfrmStates and XfrmPolicies).

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// nftCounter sums the packet counters of the rules in one chain of the
// plugin's table: "input" counts the inbound plaintext VXLAN of encrypted
// VNIs it dropped, "guard" the outbound VXLAN no IPsec policy took.
func nftCounter(ns *testbed.Netns, chain string) (uint64, error) {
	return testbed.NftPackets(ns.Path(), "overlay_plugin", chain)
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
func cutGossip(ns *testbed.Netns) (uncut func() error, err error) {
	const table = "test_gossip_cut"
	if err := testbed.NftDropPort(ns.Path(), table, gossipPort); err != nil {
		return nil, fmt.Errorf("cut gossip in %s: %w", ns.Name, err)
	}
	var (
		once   sync.Once
		delErr error
	)
	return func() error {
		once.Do(func() { delErr = testbed.DelNftTable(ns.Path(), table) })
		return delErr
	}, nil
}
