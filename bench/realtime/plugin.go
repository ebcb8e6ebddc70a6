package realtime

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// pluginSystem is system A: one cluster.Cluster per host with cluster's
// defaults and memberlist's own UDP+TCP transport; with a secret, every
// host has the same 32-byte key (encrypted gossip).
type pluginSystem struct {
	p      Params
	eps    *endpoints
	log    *slog.Logger
	secret []byte
	hosts  []*cluster.Cluster
}

func newPluginSystem(log *slog.Logger, secret bool) *pluginSystem {
	s := &pluginSystem{log: log}
	if secret {
		s.secret = bytes.Repeat([]byte{0x5e}, 32)
	}
	return s
}

func (s *pluginSystem) name() string {
	if s.secret != nil {
		return "plugin-secret"
	}
	return "plugin"
}

// pluginSink stands in for the driver: it checks each AddPeer against the
// endpoint's expected value and tells the tracker. The delivery goroutine
// of each cluster is the only caller for its host.
type pluginSink struct {
	host int
	tr   *tracker
}

func (s pluginSink) AddPeer(nid string, p peerdb.Peer) error {
	st := stWrong
	if g, ok := s.tr.eps.byID[p.EndpointID]; ok && nid == networkID && p.MAC == hwaddr.MAC(epMAC(g)) &&
		slices.Equal(p.IPs, []netip.Addr{epIP(g)}) && p.VTEP == hostAddr(1, s.tr.eps.owner(g)) {
		st = stRight
	}
	s.tr.set(s.host, p.EndpointID, st)
	return nil
}

func (s pluginSink) DeletePeer(_, eid string) error {
	s.tr.set(s.host, eid, stAbsent)
	return nil
}

func (s *pluginSystem) start(p Params, tr *tracker) (time.Duration, time.Duration, error) {
	s.p, s.eps = p, tr.eps
	var seeds []string
	for i := range min(p.Seeds, p.Hosts) {
		seeds = append(seeds, net.JoinHostPort(hostAddr(1, i).String(), strconv.Itoa(p.PortA)))
	}
	t0 := time.Now()
	for i := range p.Hosts {
		c, err := cluster.New(cluster.Config{
			NodeName:      hostName(i),
			BindAddr:      hostAddr(1, i).String(),
			BindPort:      p.PortA,
			AdvertiseAddr: hostAddr(1, i),
			Join:          seeds, // a host never joins its own address
			Sink:          pluginSink{host: i, tr: tr},
			SecretKey:     s.secret,
			Logger:        s.log.With("host", hostName(i)),
		})
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", hostName(i), err)
		}
		s.hosts = append(s.hosts, c)
	}
	if !waitFor(p.Timeout, 20*time.Millisecond, func() bool { return s.aliveViews() == p.Hosts*p.Hosts }) {
		return 0, 0, fmt.Errorf("membership not formed within %v: %d of %d member views alive", p.Timeout, s.aliveViews(), p.Hosts*p.Hosts)
	}
	membership := time.Since(t0)
	// The driver calls NetworkAdded when Docker creates the network; the
	// cluster needs no more than that to deliver the network's endpoints.
	t1 := time.Now()
	for _, c := range s.hosts {
		c.NetworkAdded(networkID)
	}
	return membership, time.Since(t1), nil
}

func (s *pluginSystem) publish(host, g int) error {
	mac := epMAC(g)
	s.hosts[host].Publish(networkID, peerdb.Peer{EndpointID: s.eps.ids[g], IPs: []netip.Addr{epIP(g)}, MAC: hwaddr.MAC(mac), Local: true})
	return nil
}

func (s *pluginSystem) aliveViews() int {
	n := 0
	for _, c := range s.hosts {
		n += c.Stats().MembersAlive
	}
	return n
}

// RecordCounts are the plugin's record counters summed over the hosts.
type RecordCounts struct {
	Accepted            uint64        `json:"accepted"` // remote updates applied, every path
	Received            cluster.Paths `json:"received"`
	Stale               cluster.Paths `json:"stale"`
	PushesFailed        uint64        `json:"pushesFailed"`   // messages to a member not sent, or dropped for a member gone
	StreamsRefused      uint64        `json:"streamsRefused"` // gossip streams refused by the bounds of those not yet checked
	StalePerAccepted    float64       `json:"stalePerAccepted"`
	ReceivedPerAccepted float64       `json:"receivedPerAccepted"`
}

func (c *RecordCounts) ratio(n uint64) float64 { return float64(n) / float64(max(c.Accepted, 1)) }

// since is the counts from b to c, with the ratios.
func (c *RecordCounts) since(b *RecordCounts) *RecordCounts {
	d := &RecordCounts{Accepted: c.Accepted - b.Accepted, Received: subPaths(c.Received, b.Received), Stale: subPaths(c.Stale, b.Stale),
		PushesFailed: c.PushesFailed - b.PushesFailed, StreamsRefused: c.StreamsRefused - b.StreamsRefused}
	d.StalePerAccepted = d.ratio(sumPaths(d.Stale))
	d.ReceivedPerAccepted = d.ratio(sumPaths(d.Received))
	return d
}

func subPaths(a, b cluster.Paths) cluster.Paths {
	return cluster.Paths{Push: a.Push - b.Push, Gossip: a.Gossip - b.Gossip, AntiEntropy: a.AntiEntropy - b.AntiEntropy, PushPull: a.PushPull - b.PushPull}
}

func sumPaths(p cluster.Paths) uint64 { return p.Push + p.Gossip + p.AntiEntropy + p.PushPull }

// recordCounts sums the plugin's counters over its hosts; nil for a
// system that keeps none.
func recordCounts(sys system) *RecordCounts {
	s, ok := sys.(*pluginSystem)
	if !ok {
		return nil
	}
	var c RecordCounts
	for _, h := range s.hosts {
		st := h.Stats()
		c.Accepted += st.Accepted + st.AcceptedFromSync + st.AcceptedFromState
		c.Received = addPaths(c.Received, st.Received)
		c.Stale = addPaths(c.Stale, st.StaleFrom)
		c.PushesFailed += st.PushErrors + st.PushesDropped
		c.StreamsRefused += st.RejectedStreamIdle + st.RejectedStreamLimit
	}
	return &c
}

func addPaths(a, b cluster.Paths) cluster.Paths {
	return cluster.Paths{Push: a.Push + b.Push, Gossip: a.Gossip + b.Gossip, AntiEntropy: a.AntiEntropy + b.AntiEntropy, PushPull: a.PushPull + b.PushPull}
}

func (s *pluginSystem) verifyTable(host int) error {
	st := s.hosts[host].Stats()
	if st.Records != s.p.Endpoints || st.OwnRecords != s.p.perHost() {
		return fmt.Errorf("%s: gossip table holds %d records (%d own), want %d (%d)", hostName(host), st.Records, st.OwnRecords, s.p.Endpoints, s.p.perHost())
	}
	return nil
}

func (s *pluginSystem) close() {
	all(len(s.hosts), func(i int) {
		if err := s.hosts[i].Close(); err != nil {
			s.log.Warn("close", "host", hostName(i), "err", err)
		}
	})
}

// settle: the cluster's Close waits for its own goroutines.
func (s *pluginSystem) settle() time.Duration { return 10 * time.Second }
