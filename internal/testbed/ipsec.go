package testbed

// A host's IPsec state, read two ways: the plugin's own report (admin API
// /v1/encryption) and the kernel's, through iproute2 (`ip -s xfrm state`,
// `ip xfrm policy`), independently of the plugin. Shared by the encrypted
// suite (test/encrypted) and the encrypted-vs-plain benchmark in the VM
// (bench/espvm).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// EncryptionStatus is the plugin's /v1/encryption report.
func (p *Plugin) EncryptionStatus() (encryption.Status, error) {
	var st encryption.Status
	err := p.AdminJSON("/v1/encryption", &st)
	return st, err
}

// DumpStatus is st as one line of JSON, for failure messages.
func DumpStatus(st encryption.Status) string {
	b, _ := json.Marshal(st)
	return string(b)
}

// RemoteOf is what st holds towards the host with underlay address vtep,
// or nil.
func RemoteOf(st encryption.Status, vtep netip.Addr) *encryption.RemoteStatus {
	for i := range st.Remotes {
		if st.Remotes[i].VTEP == vtep {
			return &st.Remotes[i]
		}
	}
	return nil
}

// WaitEncryption waits until every node's plugin runs its encryption
// manager (supported by the kernel, one own key generation).
func (c *Cluster) WaitEncryption(timeout time.Duration) error {
	for _, n := range c.Nodes {
		err := wait.Until(timeout, 250*time.Millisecond, func() error {
			st, err := n.Plugin.EncryptionStatus()
			if err != nil {
				return err
			}
			if st.Supported != "" {
				return fmt.Errorf("encryption unsupported: %s", st.Supported)
			}
			if len(st.Own) != 1 {
				return fmt.Errorf("own generations %+v, want 1", st.Own)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: encryption running: %w", n.Name, err)
		}
	}
	return nil
}

// WaitIPsec waits until every node has SAs (both directions) and an
// outbound policy that is not a blocking one towards every other node,
// and exactly those SAs: what an encrypted network with a container on
// every host leads to once gossip has spread the endpoints.
func (c *Cluster) WaitIPsec(timeout time.Duration) error {
	for _, n := range c.Nodes {
		err := wait.Until(timeout, 250*time.Millisecond, func() error {
			st, err := n.Plugin.EncryptionStatus()
			if err != nil {
				return err
			}
			for _, o := range c.Others(n) {
				r := RemoteOf(st, o.Underlay)
				if r == nil || r.Refs < 1 || r.Blocked || r.PolicySPI == 0 || r.SAs < 2 {
					return fmt.Errorf("towards %s: %+v (status %s)", o.Name, r, DumpStatus(st))
				}
			}
			if want := 2 * len(c.Others(n)); len(st.States) != want {
				return fmt.Errorf("%d SAs, want %d: %s", len(st.States), want, DumpStatus(st))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: IPsec programmed towards every other host: %w", n.Name, err)
		}
	}
	return nil
}

// XfrmState is one SA as `ip -s xfrm state` shows it.
type XfrmState struct {
	Src, Dst       netip.Addr
	Proto          string
	SPI, ReqID     uint32
	Bytes, Packets uint64
}

// XfrmPolicy is one policy as `ip xfrm policy` shows it.
type XfrmPolicy struct {
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
	reXfrmHead     = regexp.MustCompile(`^src (\S+) dst (\S+)`)
	reXfrmProtoSPI = regexp.MustCompile(`proto (\S+) spi 0x([0-9a-fA-F]+)`)
	reXfrmReqID    = regexp.MustCompile(`reqid (\d+)`)
	reXfrmCurrent  = regexp.MustCompile(`(\d+)\(bytes\), (\d+)\(packets\)`)
	reXfrmDir      = regexp.MustCompile(`\bdir (\S+)`)
	reXfrmMark     = regexp.MustCompile(`^\s*mark (0x[0-9a-fA-F]+)/(0x[0-9a-fA-F]+)`)
)

// xfrmRecords splits ip xfrm output into records: each starts with an
// unindented "src" line.
func xfrmRecords(out string) [][]string {
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

// XfrmStates lists every SA of the namespace with `ip -s xfrm state`.
// It also returns the raw output for failure messages.
func (n *Netns) XfrmStates() ([]XfrmState, string, error) {
	out, err := n.IP("-s", "xfrm", "state", "list")
	if err != nil {
		return nil, out, err
	}
	states, err := ParseXfrmStates(out)
	return states, out, err
}

// ParseXfrmStates parses the output of `ip -s xfrm state list`.
func ParseXfrmStates(out string) ([]XfrmState, error) {
	var states []XfrmState
	for _, rec := range xfrmRecords(out) {
		m := reXfrmHead.FindStringSubmatch(rec[0])
		if m == nil {
			return nil, fmt.Errorf("ip xfrm state: unexpected record start %q", rec[0])
		}
		var st XfrmState
		var err1, err2 error
		st.Src, err1 = netip.ParseAddr(m[1])
		st.Dst, err2 = netip.ParseAddr(m[2])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("ip xfrm state: addresses in %q", rec[0])
		}
		current := false
		for _, line := range rec[1:] {
			if m := reXfrmProtoSPI.FindStringSubmatch(line); m != nil && st.Proto == "" {
				st.Proto = m[1]
				v, _ := strconv.ParseUint(m[2], 16, 32)
				st.SPI = uint32(v)
				if r := reXfrmReqID.FindStringSubmatch(line); r != nil {
					v, _ := strconv.ParseUint(r[1], 10, 32)
					st.ReqID = uint32(v)
				}
			}
			if strings.Contains(line, "lifetime current:") {
				current = true
				continue
			}
			if current {
				if m := reXfrmCurrent.FindStringSubmatch(line); m != nil {
					st.Bytes, _ = strconv.ParseUint(m[1], 10, 64)
					st.Packets, _ = strconv.ParseUint(m[2], 10, 64)
				}
				current = false
			}
		}
		if st.Proto == "" {
			return nil, fmt.Errorf("ip xfrm state: no proto/spi in record %q", strings.Join(rec, "\n"))
		}
		states = append(states, st)
	}
	return states, nil
}

// XfrmPolicies lists every policy of the namespace with `ip xfrm policy`.
func (n *Netns) XfrmPolicies() ([]XfrmPolicy, string, error) {
	out, err := n.IP("xfrm", "policy", "list")
	if err != nil {
		return nil, out, err
	}
	var pols []XfrmPolicy
	for _, rec := range xfrmRecords(out) {
		p := XfrmPolicy{Text: strings.Join(rec, "\n")}
		if m := reXfrmHead.FindStringSubmatch(rec[0]); m != nil {
			p.Src, p.Dst = m[1], m[2]
		}
		inTmpl := false
		for _, line := range rec {
			if m := reXfrmDir.FindStringSubmatch(line); m != nil && p.Dir == "" {
				p.Dir = m[1]
			}
			if m := reXfrmMark.FindStringSubmatch(line); m != nil {
				v, _ := strconv.ParseUint(m[1], 0, 32)
				mask, _ := strconv.ParseUint(m[2], 0, 32)
				p.HasMark, p.Mark, p.MarkMask = true, uint32(v), uint32(mask)
			}
			if strings.HasPrefix(strings.TrimSpace(line), "tmpl ") {
				inTmpl = true
			}
			if m := reXfrmProtoSPI.FindStringSubmatch(line); m != nil && inTmpl {
				p.TmplProto = m[1]
				v, _ := strconv.ParseUint(m[2], 16, 32)
				p.TmplSPI = uint32(v)
			}
		}
		pols = append(pols, p)
	}
	return pols, out, nil
}

// SAGrowth sums, over the states src->dst, how much the counters grew from
// before to after (a state new in after counts in full).
func SAGrowth(before, after []encryption.StateInfo, src, dst netip.Addr) (pkts, bytes uint64) {
	for _, a := range after {
		if a.Src != src || a.Dst != dst {
			continue
		}
		var b0, p0 uint64
		for _, b := range before {
			if b.SPI == a.SPI && b.Dst == a.Dst {
				b0, p0 = b.Bytes, b.Packets
			}
		}
		pkts += a.Packets - p0
		bytes += a.Bytes - b0
	}
	return pkts, bytes
}

// XfrmGrowth is SAGrowth over the plugin's ESP states (its reqid) as the
// kernel lists them.
func XfrmGrowth(before, after []XfrmState, src, dst netip.Addr) (pkts, bytes uint64) {
	conv := func(ks []XfrmState) []encryption.StateInfo {
		var out []encryption.StateInfo
		for _, k := range ks {
			if k.Proto == "esp" && k.ReqID == encryption.ReqID {
				out = append(out, encryption.StateInfo{Src: k.Src, Dst: k.Dst, SPI: k.SPI, Bytes: k.Bytes, Packets: k.Packets})
			}
		}
		return out
	}
	return SAGrowth(conv(before), conv(after), src, dst)
}
