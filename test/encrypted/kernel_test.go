package encrypted

// Reading a host namespace's IPsec and nftables state with iproute2 and
// nft, independently of the plugin's own report.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// kState is one SA as `ip -s xfrm state` shows it.
type kState struct {
	Src, Dst       netip.Addr
	Proto          string
	SPI, ReqID     uint32
	Bytes, Packets uint64
}

// kPolicy is one policy as `ip xfrm policy` shows it.
type kPolicy struct {
	Src, Dst  string // selectors, with prefix length
	Dir       string
	HasMark   bool
	Mark      uint32
	MarkMask  uint32
	TmplSPI   uint32
	TmplProto string
	Text      string
}

var (
	reHead     = regexp.MustCompile(`^src (\S+) dst (\S+)`)
	reProtoSPI = regexp.MustCompile(`proto (\S+) spi 0x([0-9a-fA-F]+)`)
	reReqID    = regexp.MustCompile(`reqid (\d+)`)
	reCurrent  = regexp.MustCompile(`(\d+)\(bytes\), (\d+)\(packets\)`)
	reDir      = regexp.MustCompile(`\bdir (\S+)`)
	reMark     = regexp.MustCompile(`^\s*mark (0x[0-9a-fA-F]+)/(0x[0-9a-fA-F]+)`)
)

// records splits ip xfrm output into records: each starts with an
// unindented "src" line.
func records(out string) [][]string {
	var recs [][]string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "src ") || len(recs) == 0 {
			recs = append(recs, nil)
		}
		recs[len(recs)-1] = append(recs[len(recs)-1], line)
	}
	return recs
}

// ipXfrmStates lists every SA of the namespace with `ip -s xfrm state`.
// It also returns the raw output for failure messages.
func ipXfrmStates(ns *testbed.Netns) ([]kState, string, error) {
	out, err := ns.IP("-s", "xfrm", "state", "list")
	if err != nil {
		return nil, out, err
	}
	var states []kState
	for _, rec := range records(out) {
		m := reHead.FindStringSubmatch(rec[0])
		if m == nil {
			return nil, out, fmt.Errorf("ip xfrm state: unexpected record start %q", rec[0])
		}
		var st kState
		var err1, err2 error
		st.Src, err1 = netip.ParseAddr(m[1])
		st.Dst, err2 = netip.ParseAddr(m[2])
		if err1 != nil || err2 != nil {
			return nil, out, fmt.Errorf("ip xfrm state: addresses in %q", rec[0])
		}
		current := false
		for _, line := range rec[1:] {
			if m := reProtoSPI.FindStringSubmatch(line); m != nil && st.Proto == "" {
				st.Proto = m[1]
				v, _ := strconv.ParseUint(m[2], 16, 32)
				st.SPI = uint32(v)
				if r := reReqID.FindStringSubmatch(line); r != nil {
					v, _ := strconv.ParseUint(r[1], 10, 32)
					st.ReqID = uint32(v)
				}
			}
			if strings.Contains(line, "lifetime current:") {
				current = true
				continue
			}
			if current {
				if m := reCurrent.FindStringSubmatch(line); m != nil {
					st.Bytes, _ = strconv.ParseUint(m[1], 10, 64)
					st.Packets, _ = strconv.ParseUint(m[2], 10, 64)
				}
				current = false
			}
		}
		if st.Proto == "" {
			return nil, out, fmt.Errorf("ip xfrm state: no proto/spi in record %q", strings.Join(rec, "\n"))
		}
		states = append(states, st)
	}
	return states, out, nil
}

// ipXfrmPolicies lists every policy of the namespace with `ip xfrm policy`.
func ipXfrmPolicies(ns *testbed.Netns) ([]kPolicy, string, error) {
	out, err := ns.IP("xfrm", "policy", "list")
	if err != nil {
		return nil, out, err
	}
	var pols []kPolicy
	for _, rec := range records(out) {
		p := kPolicy{Text: strings.Join(rec, "\n")}
		if m := reHead.FindStringSubmatch(rec[0]); m != nil {
			p.Src, p.Dst = m[1], m[2]
		}
		inTmpl := false
		for _, line := range rec {
			if m := reDir.FindStringSubmatch(line); m != nil && p.Dir == "" {
				p.Dir = m[1]
			}
			if m := reMark.FindStringSubmatch(line); m != nil {
				v, _ := strconv.ParseUint(m[1], 0, 32)
				mask, _ := strconv.ParseUint(m[2], 0, 32)
				p.HasMark, p.Mark, p.MarkMask = true, uint32(v), uint32(mask)
			}
			if strings.HasPrefix(strings.TrimSpace(line), "tmpl ") {
				inTmpl = true
			}
			if m := reProtoSPI.FindStringSubmatch(line); m != nil && inTmpl {
				p.TmplProto = m[1]
				v, _ := strconv.ParseUint(m[2], 16, 32)
				p.TmplSPI = uint32(v)
			}
		}
		pols = append(pols, p)
	}
	return pols, out, nil
}

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
