package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"
	"github.com/overlay-plugin/overlay-plugin/peerdb"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

var errNoNetwork = errors.New("network not found")

// recSink is a thread-safe Sink that stores copies. If networks is set,
// AddPeer/DeletePeer fail for networks not in it (like the driver's
// ErrNotFound). lock, if set, is taken around every call, standing in for
// the driver's network lock.
type recSink struct {
	mu       sync.Mutex
	networks map[string]bool // nil: every network exists
	peers    map[string]map[string]peerdb.Peer
	adds     map[string]int        // endpoint → AddPeer calls
	dels     map[string]int        // endpoint → DeletePeer calls
	delAt    map[string]time.Time  // endpoint → last DeletePeer
	data     map[netip.Addr][]byte // VTEP → node data
	lock     *sync.Mutex
	// members are the live members' VTEPs as MemberVTEPs last gave them;
	// unannounced lists the peers AddPeer got before their VTEP was.
	members     []netip.Addr
	unannounced []string
}

func (s *recSink) memberVTEPs(vteps []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = vteps
}

func (s *recSink) liveVTEPs() ([]netip.Addr, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.members), slices.Clone(s.unannounced)
}

func (s *recSink) nodeData(vtep netip.Addr, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if data == nil {
		delete(s.data, vtep)
	} else {
		s.data[vtep] = data
	}
}

func (s *recSink) getData(vtep netip.Addr) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.data[vtep]
	return d, ok
}

func newRecSink() *recSink {
	return &recSink{peers: map[string]map[string]peerdb.Peer{}, adds: map[string]int{}, dels: map[string]int{}, delAt: map[string]time.Time{}, data: map[netip.Addr][]byte{}}
}

func (s *recSink) AddPeer(nid string, p peerdb.Peer) error {
	if s.lock != nil {
		s.lock.Lock()
		defer s.lock.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.networks != nil && !s.networks[nid] {
		return fmt.Errorf("network %s: %w", nid, errNoNetwork)
	}
	if p.Local || p.Validate() != nil {
		panic(fmt.Sprintf("sink got an unusable peer %+v", p))
	}
	if s.peers[nid] == nil {
		s.peers[nid] = map[string]peerdb.Peer{}
	}
	s.peers[nid][p.EndpointID] = p.Clone()
	s.adds[p.EndpointID]++
	if !slices.Contains(s.members, p.VTEP) {
		s.unannounced = append(s.unannounced, p.EndpointID+"@"+p.VTEP.String())
	}
	return nil
}

func (s *recSink) DeletePeer(nid, eid string) error {
	if s.lock != nil {
		s.lock.Lock()
		defer s.lock.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.networks != nil && !s.networks[nid] {
		return fmt.Errorf("network %s: %w", nid, errNoNetwork)
	}
	delete(s.peers[nid], eid)
	s.dels[eid]++
	s.delAt[eid] = time.Now()
	return nil
}

func (s *recSink) addNetwork(nid string) {
	s.mu.Lock()
	s.networks[nid] = true
	s.mu.Unlock()
}

// get returns copies of a network's peers by endpoint id.
func (s *recSink) get(nid string) map[string]peerdb.Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]peerdb.Peer{}
	for k, p := range s.peers[nid] {
		out[k] = p.Clone()
	}
	return out
}

func (s *recSink) counts(eid string) (adds, dels int, lastDel time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adds[eid], s.dels[eid], s.delAt[eid]
}

// fastTimers shortens memberlist's timers so that tests converge in tens
// of milliseconds and detect failures in well under a second.
func fastTimers(c *memberlist.Config) {
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.GossipInterval = 10 * time.Millisecond
	c.PushPullInterval = 300 * time.Millisecond
	c.SuspicionMult = 2
	c.SuspicionMaxTimeoutMult = 2
	c.TCPTimeout = 500 * time.Millisecond
	c.GossipToTheDeadTime = time.Second
	c.IndirectChecks = 1
	c.RetransmitMult = 3
}

type tnode struct {
	name string
	ip   netip.Addr
	c    *Cluster
	sink *recSink
	tr   *memnet.Transport
}

// harness runs nodes on a memnet network: node i at 10.0.0.i:7946, VTEP
// 10.0.0.i.
type harness struct {
	t     *testing.T
	net   *memnet.Network
	mu    sync.Mutex
	nodes map[string]*tnode
	// defaults for new nodes
	grace, rejoin time.Duration
	restartGrace  time.Duration // 0: the default
	wire          [2]byte       // the wire versions new nodes speak; zero: this build's
	key           []byte
	keyIDs        []string                   // Config.KeyIDs of new nodes
	memberKeyIDs  func(netip.Addr, []string) // Config.MemberKeyIDs of new nodes
	settings      Settings                   // what new nodes advertise
	tweak         func(*memberlist.Config)
	logs          *logBuf
}

// failLogLines is how much of the nodes' debug log a failed test prints.
const failLogLines = 400

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, net: memnet.New(), nodes: map[string]*tnode{}, grace: 10 * time.Second, rejoin: 200 * time.Millisecond, tweak: fastTimers, logs: &logBuf{}}
	// Cleanups run last first: the log is printed after the nodes closed.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the nodes' debug log, last %d lines:\n%s", failLogLines, h.logs.tail(failLogLines))
		}
	})
	t.Cleanup(h.closeAll)
	return h
}

// logger is testLogger when CLUSTER_TEST_LOG asks for the log on stderr,
// else a debug log into h.logs, printed if the test fails.
func (h *harness) logger() *slog.Logger {
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		return testLogger()
	}
	return slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logBuf collects the log of a test's nodes. memberlist's goroutines may
// log after the test ends, so it cannot be t.Log.
type logBuf struct {
	mu sync.Mutex // guards b; a leaf lock
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// tail returns the last n lines.
func (l *logBuf) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.SplitAfter(l.b.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "")
}

const gossipPort = 7946

func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }

// start starts node i (name "n<i>") joining the given seed nodes.
func (h *harness) start(i int, seeds ...int) *tnode {
	h.t.Helper()
	n, err := h.tryStart(i, newRecSink(), seeds...)
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) tryStart(i int, sink *recSink, seeds ...int) (*tnode, error) {
	ip := nodeIP(i)
	tr, err := h.net.NewTransport(netip.AddrPortFrom(ip, gossipPort))
	if err != nil {
		return nil, err
	}
	var join []string
	for _, s := range seeds {
		join = append(join, nodeIP(s).String()) // port defaults to the gossip port
	}
	n := &tnode{name: fmt.Sprintf("n%d", i), ip: ip, sink: sink, tr: tr}
	n.c, err = New(Config{
		NodeName:         n.name,
		BindPort:         gossipPort,
		AdvertiseAddr:    ip,
		Join:             join,
		SecretKey:        h.key,
		KeyIDs:           h.keyIDs,
		MemberKeyIDs:     h.memberKeyIDs,
		DeadGrace:        h.grace,
		RestartGrace:     h.restartGrace,
		wireRange:        h.wire,
		RejoinInterval:   h.rejoin,
		Transport:        tr,
		MemberlistConfig: h.tweak,
		Sink:             sink,
		NodeData:         sink.nodeData,
		MemberVTEPs:      sink.memberVTEPs,
		Settings:         h.settings,
		Logger:           h.logger(),
	})
	if err != nil {
		tr.Shutdown()
		return nil, err
	}
	if sink.networks == nil {
		// A sink without a network list has every network, as a driver
		// with the network created would.
		n.c.NetworkAdded(netA)
	}
	h.mu.Lock()
	h.nodes[n.name] = n
	h.mu.Unlock()
	return n, nil
}

// crash stops a node without a graceful leave (like kill -9).
func (n *tnode) crash() {
	n.c.closeOnce.Do(func() { n.c.shutdown(false) })
}

func (h *harness) closeAll() {
	h.mu.Lock()
	nodes := slices.Collect(maps.Values(h.nodes))
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() { n.c.Close() })
	}
	wg.Wait()
}

// tick is how often the tests poll a condition.
const tick = 10 * time.Millisecond

func aliveMembers(c *Cluster) int {
	n := 0
	for _, m := range c.Members() {
		if m.State == MemberAlive {
			n++
		}
	}
	return n
}

func waitMembers(t *testing.T, nodes []*tnode, want int) {
	t.Helper()
	waitMembersWithin(t, nodes, want, 10*time.Second)
}

func waitMembersWithin(t *testing.T, nodes []*tnode, want int, timeout time.Duration) {
	t.Helper()
	wait.For(t, timeout, tick, "membership", func() error {
		for _, n := range nodes {
			if got := aliveMembers(n.c); got != want {
				return fmt.Errorf("%s sees %d alive members, want %d", n.name, got, want)
			}
		}
		return nil
	})
}

// ep describes an expected remote endpoint.
type ep struct {
	owner *tnode
	p     peerdb.Peer
}

// checkPeers compares a view (sink contents or snapshot) of node n with the
// expected endpoints, leaving out n's own.
func checkPeers(n *tnode, got map[string]peerdb.Peer, want map[string]ep) error {
	exp := 0
	for eid, w := range want {
		if w.owner == n {
			continue
		}
		exp++
		g, ok := got[eid]
		if !ok {
			return fmt.Errorf("%s lacks %s", n.name, eid)
		}
		if g.VTEP != w.owner.ip || g.MAC != w.p.MAC || !slices.Equal(g.IPs, w.p.IPs) || g.Local {
			return fmt.Errorf("%s has %s = %+v, want %+v at VTEP %v", n.name, eid, g, w.p, w.owner.ip)
		}
	}
	if len(got) != exp {
		return fmt.Errorf("%s has %d peers, want %d: %v", n.name, len(got), exp, slices.Sorted(maps.Keys(got)))
	}
	return nil
}

func snapshotMap(c *Cluster, nid string) map[string]peerdb.Peer {
	out := map[string]peerdb.Peer{}
	for _, p := range c.Snapshot(nid) {
		out[p.EndpointID] = p
	}
	return out
}

// waitConverged waits until every node's sink and snapshot hold exactly the
// expected remote endpoints of nid.
func waitConverged(t *testing.T, nodes []*tnode, nid string, want map[string]ep, timeout time.Duration) {
	t.Helper()
	wait.For(t, timeout, tick, "convergence of "+nid, func() error { return converged(nodes, nid, want) })
}

// converged reports how a node's sink or snapshot of nid differs from
// want, if it does.
func converged(nodes []*tnode, nid string, want map[string]ep) error {
	for _, n := range nodes {
		if err := checkPeers(n, n.sink.get(nid), want); err != nil {
			return fmt.Errorf("sink: %w", err)
		}
		if err := checkPeers(n, snapshotMap(n.c, nid), want); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	return nil
}

// waitNetworkMembers waits until every node knows want nodes (itself
// included) to have network nid.
func waitNetworkMembers(t *testing.T, nodes []*tnode, nid string, want int) {
	t.Helper()
	wait.For(t, 5*time.Second, tick, "network memberships", func() error {
		for _, n := range nodes {
			n.c.mu.Lock()
			got := len(n.c.st.networkMembers(nid))
			if n.c.st.interested(nid) {
				got++
			}
			n.c.mu.Unlock()
			if got != want {
				return fmt.Errorf("%s knows %d members of %s, want %d", n.name, got, nid, want)
			}
		}
		return nil
	})
}
