package servicelb

// Privileged tests of the data path: real connections from the client
// namespace to VIPs, balanced by the rules Apply programs.

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// apply programs the client's sandbox, failing t on error.
func (l *lab) apply(t *testing.T, svcs ...Service) {
	t.Helper()
	if err := NewNftables().Apply(l.clientPath, svcs); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// counters reads the client's counters, by backend name, of one VIP.
func (l *lab) counters(t *testing.T, vip netip.Addr) map[string]uint64 {
	t.Helper()
	all, err := NewNftables().Counters(l.clientPath)
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	out := map[string]uint64{}
	for b, n := range all {
		if b.VIP != vip {
			continue
		}
		for _, be := range l.backends {
			if b.Addr == be.addr4 || b.Addr == be.addr6 {
				out[be.name] = n
			}
		}
	}
	return out
}

// checkSpread checks that every backend named got some of the answers,
// and that the counters grew by exactly the answers each got.
func (l *lab) checkSpread(t *testing.T, vip netip.Addr, before map[string]uint64, got map[string]int, names ...string) {
	t.Helper()
	after := l.counters(t, vip)
	total := 0
	for _, name := range names {
		if got[name] == 0 {
			t.Errorf("backend %s got no connection: %v", name, got)
		}
		if after[name]-before[name] != uint64(got[name]) {
			t.Errorf("backend %s: counter went %d -> %d, but it got %d connections", name, before[name], after[name], got[name])
		}
		total += got[name]
	}
	if n := len(got); n != len(names) || total != sum(got) {
		t.Errorf("answers from %v, want only %v", got, names)
	}
}

func sum[V int | uint64](m map[string]V) V {
	var n V
	for _, v := range m {
		n += v
	}
	return n
}

// services are a VIP of each family balanced over every backend, and one
// without backends.
func (l *lab) services() []Service {
	return []Service{
		{Name: "web", VIP: vip4, Backends: l.backendAddrs(false)},
		{Name: "web6", VIP: vip6, Backends: l.backendAddrs(true)},
		{Name: "none", VIP: vipNone},
	}
}

func TestBalanceTCPAndUDP(t *testing.T) {
	l := newLab(t)
	l.apply(t, l.services()...)
	for _, c := range []struct {
		name string
		vip  netip.Addr
		udp  bool
	}{
		{"tcp4", vip4, false},
		{"udp4", vip4, true},
		{"tcp6", vip6, false},
		{"udp6", vip6, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := l.counters(t, c.vip)
			got := l.spread(t, c.vip, 60, c.udp)
			t.Logf("60 connections to %s: %v", c.vip, got)
			l.checkSpread(t, c.vip, before, got, "A", "B", "C")
		})
	}
}

func TestPingVIP(t *testing.T) {
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skipf("no ping: %v", err)
	}
	l := newLab(t)
	l.apply(t, l.services()...)
	for _, vip := range []netip.Addr{vip4, vip6} {
		before := sum(l.counters(t, vip))
		out, err := exec.Command("nsenter", "--net="+l.clientPath, "ping", "-c", "1", "-W", "5", vip.String()).CombinedOutput()
		if err != nil {
			t.Errorf("ping %s: %v\n%s", vip, err, out)
		}
		if after := sum(l.counters(t, vip)); after != before+1 {
			t.Errorf("ping %s: counters went %d -> %d, want one more", vip, before, after)
		}
	}
	start := time.Now()
	out, err := exec.Command("nsenter", "--net="+l.clientPath, "ping", "-c", "1", "-W", "5", vipNone.String()).CombinedOutput()
	if err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("ping of a VIP without backends: %v after %v\n%s", err, time.Since(start), out)
	}
}

// refusedFast checks that connecting to vip fails at once: TCP with
// ECONNREFUSED (the reset), UDP with EPERM (the reject verdict drops the
// datagram in the sender's own output path, so the send itself fails) or
// ECONNREFUSED (the ICMP error, should the send have succeeded).
func (l *lab) refusedFast(t *testing.T, vip netip.Addr) {
	t.Helper()
	for _, udp := range []bool{false, true} {
		start := time.Now()
		var err error
		if udp {
			_, err = l.askUDP(vip)
		} else {
			_, err = l.ask(vip)
		}
		refused := errors.Is(err, syscall.ECONNREFUSED) || (udp && errors.Is(err, syscall.EPERM))
		if took := time.Since(start); !refused || took > time.Second {
			t.Errorf("connection to %s (udp %v): %v after %v; want refused within a second", vip, udp, err, took)
		}
	}
}

func TestServiceWithoutBackendsRefuses(t *testing.T) {
	l := newLab(t)
	none6 := vip6.Next()
	l.apply(t, Service{Name: "none", VIP: vipNone}, Service{Name: "none6", VIP: none6},
		Service{Name: "web", VIP: vip4, Backends: l.backendAddrs(false)})
	l.refusedFast(t, vipNone)
	l.refusedFast(t, none6)
	if _, err := l.ask(vip4); err != nil {
		t.Errorf("the service with backends: %v", err)
	}
}

// TestBackendRemovedMidStream: streams to every backend are open when one
// backend goes, then all, then one comes back: established streams keep
// working throughout (conntrack keeps their NAT), new connections never
// reach a removed backend, and, without backends, fail at once.
func TestBackendRemovedMidStream(t *testing.T) {
	l := newLab(t)
	web := func(names ...string) Service {
		return Service{Name: "web", VIP: vip4, Backends: l.backendAddrs(false, names...)}
	}
	l.apply(t, web("A", "B", "C"))
	streams := map[string]*stream{}
	for i := 0; len(streams) < 3; i++ {
		if i == 200 {
			t.Fatalf("200 connections did not reach every backend: %v", streams)
		}
		s, err := l.dial(vip4)
		if err != nil {
			t.Fatal(err)
		}
		if streams[s.backend] != nil {
			s.conn.Close()
			continue
		}
		streams[s.backend] = s
		t.Cleanup(func() { s.conn.Close() })
	}
	streamsWork := func(when string) {
		t.Helper()
		for name, s := range streams {
			if got, err := s.ask(); err != nil || got != name {
				t.Errorf("%s: stream to %s answered %q, %v", when, name, got, err)
			}
		}
	}

	before := l.counters(t, vip4)
	l.apply(t, web("B", "C"))
	streamsWork("A removed")
	got := l.spread(t, vip4, 60, false)
	l.checkSpread(t, vip4, before, got, "B", "C")
	if _, ok := l.counters(t, vip4)["A"]; ok {
		t.Errorf("A still has a counter")
	}

	l.apply(t, Service{Name: "web", VIP: vip4})
	l.refusedFast(t, vip4)
	streamsWork("every backend removed")

	l.apply(t, web("C"))
	streamsWork("C back")
	got = l.spread(t, vip4, 10, false)
	if got["C"] != 10 {
		t.Errorf("with only C: %v", got)
	}
}

// TestOtherNATKeepsWorking: Docker's NAT for its embedded DNS server
// (127.0.0.11:53 to the port it really listens on) shares the output hook
// with our dnat chain, at the same priority; both keep working, and
// neither Apply nor Remove touches that table.
func TestOtherNATKeepsWorking(t *testing.T) {
	l := newLab(t)
	script := filepath.Join(filepath.Dir(l.clientPath), "foreign.nft")
	if err := os.WriteFile(script, []byte(foreignTable), 0o600); err != nil {
		t.Fatal(err)
	}
	nft(t, l.clientPath, "-f", script)
	foreign := nft(t, l.clientPath, "list", "table", "ip", "slbdocker")
	serveUDP(t, l.client.ns, "127.0.0.11:5353", "dns")
	dns := netip.MustParseAddrPort("127.0.0.11:53")
	dnsWorks := func(when string) {
		t.Helper()
		if got, err := l.askUDPAt(dns); err != nil || got != "dns" {
			t.Errorf("%s: DNS through Docker's NAT answered %q, %v", when, got, err)
		}
	}
	dnsWorks("before Apply")
	l.apply(t, Service{Name: "web", VIP: vip4, Backends: l.backendAddrs(false)}, Service{Name: "none", VIP: vipNone})
	dnsWorks("after Apply")
	if got := l.spread(t, vip4, 10, true); sum(got) != 10 {
		t.Errorf("VIP with Docker's NAT present: %v", got)
	}
	l.refusedFast(t, vipNone)
	l.apply(t, Service{Name: "web", VIP: vip4, Backends: l.backendAddrs(false, "A")})
	dnsWorks("after a change")
	if err := NewNftables().Remove(l.clientPath); err != nil {
		t.Fatal(err)
	}
	dnsWorks("after Remove")
	if got := nft(t, l.clientPath, "list", "table", "ip", "slbdocker"); got != foreign {
		t.Errorf("Docker's table changed:\n%s\nwant\n%s", got, foreign)
	}
}

// TestUDPFlowLeavesRemovedBackend: a UDP flow (one socket that keeps
// sending) balanced to a backend that is then removed moves to the others
// at its next datagram, rather than stay on the removed one for as long as
// it keeps sending; flows to the other backends stay where they are.
func TestUDPFlowLeavesRemovedBackend(t *testing.T) {
	l := newLab(t)
	web := func(names ...string) Service {
		return Service{Name: "web", VIP: vip4, Backends: l.backendAddrs(false, names...)}
	}
	l.apply(t, web("A", "B", "C"))
	flows := map[string]net.Conn{}
	for i := 0; flows["A"] == nil || flows["B"] == nil; i++ {
		if i == 200 {
			t.Fatalf("200 UDP flows did not reach A and B: %v", flows)
		}
		c, err := l.dialUDP(netip.AddrPortFrom(vip4, udpPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		name, err := askUDPOn(c)
		if err != nil {
			t.Fatal(err)
		}
		if flows[name] == nil {
			flows[name] = c
		}
	}
	for _, name := range []string{"A", "B"} {
		if got, err := askUDPOn(flows[name]); got != name || err != nil {
			t.Fatalf("flow to %s moved before any change: %q, %v", name, got, err)
		}
	}

	l.apply(t, web("B", "C"))
	if got, err := askUDPOn(flows["A"]); err != nil || (got != "B" && got != "C") {
		t.Errorf("flow to the removed A answered by %q, %v; want B or C", got, err)
	}
	if got, err := askUDPOn(flows["B"]); err != nil || got != "B" {
		t.Errorf("flow to B answered by %q, %v", got, err)
	}
}
