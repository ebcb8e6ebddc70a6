package health

import (
	"context"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lines records the log lines a prober writes.
type lines struct {
	mu  sync.Mutex
	got []slog.Record
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r.Clone())
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

// find returns the first line with msg at or after t, waiting a tick for
// it: a state changes under the prober's lock, its line goes out after.
func (l *lines) find(msg string, after time.Time) (slog.Record, bool) {
	for range 2 {
		l.mu.Lock()
		for _, r := range l.got {
			if r.Message == msg && !r.Time.Before(after) {
				l.mu.Unlock()
				return r, true
			}
		}
		l.mu.Unlock()
		time.Sleep(tick)
	}
	return slog.Record{}, false
}

// host is one prober on the fake net with its peers fixed.
type host struct {
	addr netip.Addr
	p    *Prober
	log  *lines
}

const testPort = 4799

// startHosts runs a prober per address, each with every other as a peer
// (MTU 1450, ESP 1424 when esp), until the test's bubble ends.
func startHosts(t *testing.T, fn *fakeNet, esp bool, addrs ...string) []*host {
	var hosts []*host
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, a := range addrs {
		h := &host{addr: netip.MustParseAddr(a), log: &lines{}}
		var peers []Peer
		for _, b := range addrs {
			if b != a {
				pe := Peer{VTEP: netip.MustParseAddr(b), MTU: 1450}
				if esp {
					pe.ESPMTU = 1424
				}
				peers = append(peers, pe)
			}
		}
		conns := map[Path]Conn{PathVXLAN: fn.conn(netip.AddrPortFrom(h.addr, testPort), PathVXLAN)}
		if esp {
			conns[PathESP] = fn.conn(netip.AddrPortFrom(h.addr, testPort), PathESP)
		}
		h.p = New(Config{Conns: conns, Port: testPort, VXLANPort: 4789, Log: slog.New(h.log),
			Peers: func() []Peer { return peers },
			Known: func() map[netip.Addr]Known {
				m := map[netip.Addr]Known{}
				for _, pe := range peers {
					m[pe.VTEP] = Known{Gossip: GossipAlive}
				}
				return m
			}})
		go h.p.Run(ctx)
		hosts = append(hosts, h)
	}
	return hosts
}

func (h *host) status(t *testing.T, peer string, path Path) PathStatus {
	t.Helper()
	for _, s := range h.p.Status() {
		if s.Peer.String() == peer && s.Path == path {
			return s
		}
	}
	return PathStatus{} // not refreshed yet
}

// waitState advances virtual time until h sees peer's path in st, and
// returns how long that took; it fails after limit.
func waitState(t *testing.T, h *host, peer string, path Path, st State, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) <= limit {
		if h.status(t, peer, path).State == st {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: %s path to %s is %s, not %s, %v after the change", h.addr, path, peer, h.status(t, peer, path).State, st, limit)
	return 0
}

func TestBlockedVXLANIsReportedAndClears(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		hs := startHosts(t, fn, false, "198.51.100.1", "198.51.100.2")
		waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateUp, 2*Interval)
		waitState(t, hs[1], "198.51.100.1", PathVXLAN, StateUp, 2*Interval)

		broke := time.Now()
		fn.set(func(n *fakeNet) { n.blocked[PathVXLAN] = true })
		for _, h := range hs {
			peer := hs[0].addr.String()
			if h == hs[0] {
				peer = hs[1].addr.String()
			}
			took := waitState(t, h, peer, PathVXLAN, StateDown, 10*time.Second)
			s := h.status(t, peer, PathVXLAN)
			if !strings.Contains(s.Problem, "a firewall between the hosts drops UDP 4789") {
				t.Errorf("%s: problem %q does not name the blocked port", h.addr, s.Problem)
			}
			w, ok := h.log.find("data path broken", broke)
			if !ok || w.Level != slog.LevelWarn {
				t.Fatalf("%s: no WARN after the block", h.addr)
			}
			t.Logf("%s saw it in %v: %s", h.addr, took, s.Problem)
		}

		healed := time.Now()
		fn.set(func(n *fakeNet) { n.blocked[PathVXLAN] = false })
		took := waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateUp, 10*time.Second)
		if _, ok := hs[0].log.find("data path restored", healed); !ok {
			t.Error("no INFO when the path came back")
		}
		t.Logf("cleared in %v", took)
	})
}

func TestFilteredESPNamesProtocol50(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		hs := startHosts(t, fn, true, "198.51.100.1", "198.51.100.2")
		waitState(t, hs[0], "198.51.100.2", PathESP, StateUp, 2*Interval)
		fn.set(func(n *fakeNet) { n.blocked[PathESP] = true })
		waitState(t, hs[0], "198.51.100.2", PathESP, StateDown, 10*time.Second)
		if s := hs[0].status(t, "198.51.100.2", PathVXLAN); s.State != StateUp {
			t.Errorf("plain path %s while only ESP is filtered", s.State)
		}
		if p := hs[0].status(t, "198.51.100.2", PathESP).Problem; !strings.Contains(p, "IP protocol 50") {
			t.Errorf("problem %q does not name ESP", p)
		}
	})
}

func TestMTUBlackHoleFindsTheLargestPacket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		hs := startHosts(t, fn, false, "198.51.100.1", "198.51.100.2")
		waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateUp, 2*Interval)
		fn.set(func(n *fakeNet) { n.maxSize[PathVXLAN] = 1350 })
		waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateMTU, 10*time.Second)
		s := hs[0].status(t, "198.51.100.2", PathVXLAN)
		if s.PathMTU > 1350 || s.PathMTU < 1340 {
			t.Errorf("path MTU %d, want within 10 bytes under 1350", s.PathMTU)
		}
		if !strings.Contains(s.Problem, "above "+strconv.Itoa(s.PathMTU)+" bytes") || !strings.Contains(s.Problem, "MTU is 1450") {
			t.Errorf("problem %q", s.Problem)
		}
	})
}

// A black hole one way only (the peer's large packets to this host are
// lost, this host's to it cross) is seen from both ends: the peer's own
// probes find it, and it tells this host.
func TestOneWayMTUBlackHoleIsSeenFromBothEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		hs := startHosts(t, fn, false, "198.51.100.1", "198.51.100.2")
		waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateUp, 2*Interval)
		waitState(t, hs[1], "198.51.100.1", PathVXLAN, StateUp, 2*Interval)
		fn.set(func(n *fakeNet) { n.maxFrom[hs[1].addr] = 1350 })
		waitState(t, hs[1], "198.51.100.1", PathVXLAN, StateMTU, 10*time.Second)
		took := waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateMTU, 10*time.Second)
		s := hs[0].status(t, "198.51.100.2", PathVXLAN)
		if !strings.Contains(s.Problem, "bytes from 198.51.100.2 are lost") {
			t.Errorf("the receiving end's problem %q does not say the loss is on the way back", s.Problem)
		}
		t.Logf("the receiving end knew after %v: %s", took, s.Problem)
		fn.set(func(n *fakeNet) { n.maxFrom[hs[1].addr] = 0 })
		waitState(t, hs[0], "198.51.100.2", PathVXLAN, StateUp, 10*time.Second)
		waitState(t, hs[1], "198.51.100.1", PathVXLAN, StateUp, 10*time.Second)
	})
}
