package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Family is an IP address family.
type Family int

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Underlay prefixes: documentation ranges, far from this machine's own.
var (
	UnderlayIPv4 = netip.MustParsePrefix("198.51.100.0/24")
	UnderlayIPv6 = netip.MustParsePrefix("2001:db8:ffff::/64")
)

const (
	switchBridge = "br0"
	// HostLink is the name of every host's underlay interface.
	HostLink = "eth0"
)

// Topology is a switch namespace with a bridge and hosts attached to it.
type Topology struct {
	Bed    *Bed
	Family Family
	Switch *Netns
	Hosts  []*Host
}

// Host is a namespace standing in for one machine of the cluster.
type Host struct {
	// Name is the short name, "h1", "h2", ...
	Name string
	NS   *Netns
	// Underlay is the host's address on the switch; Prefix includes the
	// prefix length.
	Underlay netip.Addr
	Prefix   netip.Prefix
	// Dir is the host's scratch directory (plugin sockets, state, logs).
	Dir string

	index int
	port  string // the switch side of the host's link
	topo  *Topology
}

// NewTopology builds a switch and n hosts with underlay addresses of the
// given family: host i (1-based) gets 198.51.100.i/24 or 2001:db8:ffff::i/64.
func (b *Bed) NewTopology(family Family, n int) (*Topology, error) {
	if family != IPv4 && family != IPv6 {
		return nil, fmt.Errorf("testbed: unknown family %d", family)
	}
	sw, err := b.NewNetns("sw")
	if err != nil {
		return nil, err
	}
	t := &Topology{Bed: b, Family: family, Switch: sw}
	steps := [][]string{
		{"link", "add", switchBridge, "type", "bridge", "stp_state", "0", "forward_delay", "0", "mcast_snooping", "0"},
		{"link", "set", switchBridge, "up"},
	}
	for _, s := range steps {
		if _, err := sw.IP(s...); err != nil {
			return nil, err
		}
	}
	// The switch has no addresses of its own; keep it quiet.
	if err := sw.Sysctl("net.ipv6.conf.all.disable_ipv6", "1"); err != nil {
		return nil, err
	}
	for range n {
		if _, err := t.AddHost(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// AddHost adds the next host (h1, h2, ...) to the switch.
func (t *Topology) AddHost() (*Host, error) {
	i := len(t.Hosts) + 1
	if i >= outsiderIndex {
		return nil, errors.New("testbed: too many hosts")
	}
	h, err := t.attach(fmt.Sprintf("h%d", i), i)
	if err != nil {
		return nil, err
	}
	t.Hosts = append(t.Hosts, h)
	return h, nil
}

// outsiderIndex is the underlay address (and switch port) of the outsider:
// above every host's.
const outsiderIndex = 250

// AddOutsider attaches a machine to the switch that is not a host of the
// cluster, runs no plugin and knows no secret: someone else on the same
// underlay. It is not in Hosts.
func (t *Topology) AddOutsider() (*Host, error) {
	return t.attach("outsider", outsiderIndex)
}

// attach makes a namespace with an underlay interface, address i of the
// underlay, plugged into the switch.
func (t *Topology) attach(name string, i int) (*Host, error) {
	ns, err := t.Bed.NewNetns(name)
	if err != nil {
		return nil, err
	}
	h := &Host{Name: name, NS: ns, index: i, port: fmt.Sprintf("p%d", i), topo: t,
		Dir: filepath.Join(t.Bed.Dir(), name)}
	if err := os.MkdirAll(h.Dir, 0o755); err != nil {
		return nil, err
	}
	var addrArgs []string
	if t.Family == IPv4 {
		h.Underlay = nthAddr(UnderlayIPv4, i)
		h.Prefix = netip.PrefixFrom(h.Underlay, UnderlayIPv4.Bits())
		addrArgs = []string{"addr", "add", h.Prefix.String(), "dev", HostLink}
	} else {
		h.Underlay = nthAddr(UnderlayIPv6, i)
		h.Prefix = netip.PrefixFrom(h.Underlay, UnderlayIPv6.Bits())
		addrArgs = []string{"addr", "add", h.Prefix.String(), "dev", HostLink, "nodad"}
	}
	// The pair is made inside the switch, its host end sent straight to the
	// host: nothing ever appears in the root namespace.
	swSteps := [][]string{
		{"link", "add", h.port, "type", "veth", "peer", "name", HostLink, "netns", ns.Name},
		{"link", "set", h.port, "master", switchBridge},
		{"link", "set", h.port, "up"},
	}
	for _, s := range swSteps {
		if _, err := t.Switch.IP(s...); err != nil {
			return nil, err
		}
	}
	if _, err := ns.IP(addrArgs...); err != nil {
		return nil, err
	}
	if _, err := ns.IP("link", "set", HostLink, "up"); err != nil {
		return nil, err
	}
	return h, nil
}

// nthAddr returns the i-th address of p (p.Addr() + i).
func nthAddr(p netip.Prefix, i int) netip.Addr {
	a := p.Masked().Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// SetLink connects (up) or disconnects (down) the host from the switch by
// its switch port; the host keeps its address and sees NO-CARRIER, as a
// machine does when its cable is pulled.
func (h *Host) SetLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	_, err := h.topo.Switch.IP("link", "set", h.port, state)
	return err
}

// PortBytes returns the byte counters of the host's switch port, seen from
// the switch: rx is what the host sent onto the underlay, tx what it was
// sent.
func (h *Host) PortBytes() (rx, tx uint64, err error) {
	out, err := h.topo.Switch.IP("-j", "-s", "link", "show", h.port)
	if err != nil {
		return 0, 0, err
	}
	var links []struct {
		Stats struct {
			RX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"rx"`
			TX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		return 0, 0, fmt.Errorf("parse link stats of %s: %v: %s", h.port, err, strings.TrimSpace(out))
	}
	return links[0].Stats.RX.Bytes, links[0].Stats.TX.Bytes, nil
}

// WaitUnderlay waits until every host answers ICMP from every other host
// over the underlay, or timeout passes.
func (t *Topology) WaitUnderlay(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, from := range t.Hosts {
		for _, to := range t.Hosts {
			if from == to {
				continue
			}
			if err := from.NS.PingUntil(to.Underlay, time.Until(deadline)); err != nil {
				return fmt.Errorf("underlay %s -> %s: %w", from.Name, to.Name, err)
			}
		}
	}
	return nil
}

// Link is one interface as `ip -j -d link` reports it.
type Link struct {
	Name      string `json:"ifname"`
	OperState string `json:"operstate"`
	Master    string `json:"master"`
	Address   string `json:"address"`
	MTU       int    `json:"mtu"`
	LinkInfo  *struct {
		Kind string `json:"info_kind"`
	} `json:"linkinfo"`
}

// Kind is the link's type ("veth", "vxlan", "bridge", ...), empty for
// plain devices such as lo.
func (l Link) Kind() string {
	if l.LinkInfo == nil {
		return ""
	}
	return l.LinkInfo.Kind
}

func (l Link) String() string {
	if k := l.Kind(); k != "" {
		return l.Name + "(" + k + ")"
	}
	return l.Name
}

// Links lists the namespace's interfaces.
func (n *Netns) Links() ([]Link, error) {
	out, err := n.IP("-j", "-d", "link", "show")
	if err != nil {
		return nil, err
	}
	var links []Link
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return nil, fmt.Errorf("parse ip -j link output of %s: %w: %s", n.Name, err, strings.TrimSpace(out))
	}
	return links, nil
}

// ExtraLinks lists the host's interfaces other than lo and its underlay
// link: what plugins and containers left behind.
func (h *Host) ExtraLinks() ([]Link, error) {
	links, err := h.NS.Links()
	if err != nil {
		return nil, err
	}
	var extra []Link
	for _, l := range links {
		if l.Name != "lo" && l.Name != HostLink {
			extra = append(extra, l)
		}
	}
	return extra, nil
}
