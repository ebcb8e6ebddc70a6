package realtime

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/moby/moby/v2/daemon/libnetwork/networkdb"
	"github.com/sirupsen/logrus"
)

// peerTable is the table libnetwork's overlay driver keeps its endpoints in.
const peerTable = "overlay_peer_table"

// peerValue is endpoint g's table value: the fields of libnetwork's
// PeerRecord (endpoint address, MAC, VTEP), about 100 bytes.
func peerValue(g, owner int) []byte {
	m := epMAC(g)
	return fmt.Appendf(nil, `{"EndpointIP":"%s/8","EndpointMAC":"%02x:%02x:%02x:%02x:%02x:%02x","TunnelEndpointIP":"%s"}`,
		epIP(g), m[0], m[1], m[2], m[3], m[4], m[5], hostAddr(2, owner))
}

// networkDBSystem is system B: one NetworkDB per host, DefaultConfig, each
// watching the peer table of the network as libnetwork's agent does.
type networkDBSystem struct {
	p       Params
	eps     *endpoints
	hosts   []*networkdb.NetworkDB
	cancels []func()
	watches sync.WaitGroup
}

func newNetworkDBSystem() *networkDBSystem { return &networkDBSystem{} }

func (*networkDBSystem) name() string { return "networkdb" }

func (s *networkDBSystem) start(p Params, tr *tracker) (time.Duration, time.Duration, error) {
	s.p, s.eps = p, tr.eps
	var seeds []string
	for i := range min(p.Seeds, p.Hosts) {
		seeds = append(seeds, net.JoinHostPort(hostAddr(2, i).String(), strconv.Itoa(p.PortB)))
	}
	t0 := time.Now()
	for i := range p.Hosts {
		cfg := networkdb.DefaultConfig()
		cfg.Hostname = hostName(i)
		cfg.BindAddr = hostAddr(2, i).String()
		cfg.AdvertiseAddr = cfg.BindAddr
		cfg.BindPort = p.PortB
		db, err := networkdb.New(cfg)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", hostName(i), err)
		}
		s.hosts = append(s.hosts, db)
	}
	// Join is synchronous (a push/pull with the seeds) and fails if none
	// answers; every host is told the same seeds, as libnetwork's agent is
	// told the swarm managers.
	for i, db := range s.hosts {
		var own []string
		for _, a := range seeds {
			if a != net.JoinHostPort(hostAddr(2, i).String(), strconv.Itoa(p.PortB)) {
				own = append(own, a)
			}
		}
		if err := db.Join(own); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", hostName(i), err)
		}
	}
	if !waitFor(p.Timeout, 20*time.Millisecond, func() bool { return s.aliveViews() == p.Hosts*p.Hosts }) {
		return 0, 0, fmt.Errorf("membership not formed within %v: %d of %d member views alive", p.Timeout, s.aliveViews(), p.Hosts*p.Hosts)
	}
	membership := time.Since(t0)

	// Watch before joining the network so that no entry is missed, as
	// libnetwork does when a network is created on the node.
	for i, db := range s.hosts {
		ch, cancel := db.Watch(peerTable, networkID)
		s.cancels = append(s.cancels, cancel)
		s.watches.Go(func() {
			for {
				select {
				case <-ch.Done():
					return
				case ev := <-ch.C:
					s.event(tr, i, ev.(networkdb.WatchEvent))
				}
			}
		})
	}
	t1 := time.Now()
	if err := parallel(len(s.hosts), func(i int) error { return s.hosts[i].JoinNetwork(networkID) }); err != nil {
		return 0, 0, err
	}
	if !waitFor(p.Timeout, 20*time.Millisecond, func() bool {
		for _, db := range s.hosts {
			if len(db.Peers(networkID)) != p.Hosts {
				return false
			}
		}
		return true
	}) {
		return 0, 0, fmt.Errorf("network membership not formed within %v", p.Timeout)
	}
	return membership, time.Since(t1), nil
}

func (s *networkDBSystem) event(tr *tracker, host int, ev networkdb.WatchEvent) {
	if ev.Value == nil {
		tr.set(host, ev.Key, stAbsent)
		return
	}
	st := stWrong
	if g, ok := s.eps.byID[ev.Key]; ok && bytes.Equal(ev.Value, peerValue(g, s.eps.owner(g))) {
		st = stRight
	}
	tr.set(host, ev.Key, st)
}

func (s *networkDBSystem) publish(host, g int) error {
	return s.hosts[host].CreateEntry(peerTable, networkID, s.eps.ids[g], peerValue(g, host))
}

func (s *networkDBSystem) aliveViews() int {
	n := 0
	for _, db := range s.hosts {
		n += len(db.ClusterPeers())
	}
	return n
}

func (s *networkDBSystem) verifyTable(host int) error {
	tab := s.hosts[host].GetTableByNetwork(peerTable, networkID)
	bad := 0
	for g, id := range s.eps.ids {
		if e := tab[id]; e == nil || !bytes.Equal(e.Value, peerValue(g, s.eps.owner(g))) {
			bad++
		}
	}
	if bad > 0 || len(tab) != len(s.eps.ids) {
		return fmt.Errorf("%s: table holds %d entries, %d of the %d expected missing or wrong", hostName(host), len(tab), bad, len(s.eps.ids))
	}
	return nil
}

func (s *networkDBSystem) close() {
	for _, cancel := range s.cancels {
		cancel()
	}
	s.watches.Wait()
	all(len(s.hosts), func(i int) { s.hosts[i].Close() })
}

// logrusHook counts NetworkDB's (and its memberlist's) warnings and errors,
// which reach logrus through containerd/log.
type logrusHook struct{ *logCounter }

func (logrusHook) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (h logrusHook) Fire(e *logrus.Entry) error {
	h.count(e.Message)
	return nil
}

var logrusOnce sync.Once

// quietLogrus counts NetworkDB's warnings and errors in logs instead of
// printing them (one hook for the process: logrus is global).
func quietLogrus(logs *logCounter) {
	logrusOnce.Do(func() {
		l := log.L.Logger
		l.SetOutput(io.Discard)
		l.SetLevel(logrus.WarnLevel)
		l.AddHook(logrusHook{logs})
	})
}

// settle: a bulk sync in flight when its host closes waits for the peer's
// ack for up to 30 s (networkdb's bulkSyncNode), watching no context.
func (s *networkDBSystem) settle() time.Duration { return 35 * time.Second }
