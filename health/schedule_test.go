package health

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"
)

// TestProbeScheduleIsBounded runs one prober against 1,000 healthy peers
// for a minute of virtual time and checks the bound the package states:
// one probe per peer and path per Interval ±20%, no more, spread out; the
// traffic it logs is the cost figure the documentation gives.
func TestProbeScheduleIsBounded(t *testing.T) {
	const peers = 1000
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		self := netip.MustParseAddr("10.0.0.1")
		var list []Peer
		for i := range peers {
			a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
			list = append(list, Peer{VTEP: a, MTU: 1450})
			answerer := fn.conn(netip.AddrPortFrom(a, testPort), PathVXLAN)
			go func() {
				b := make([]byte, 1<<16)
				for {
					n, from, err := answerer.ReadFromUDPAddrPort(b)
					if err != nil {
						return
					}
					m, _ := parseMessage(b[:n])
					answerer.WriteToUDPAddrPort(appendMessage(nil, message{kind: kindReply, seq: m.seq}, 0), from)
				}
			}()
			t.Cleanup(func() { answerer.Close() })
		}
		c := fn.conn(netip.AddrPortFrom(self, testPort), PathVXLAN)
		rec := &recordConn{Conn: c, at: map[netip.Addr][]time.Time{}}
		p := New(Config{Conns: map[Path]Conn{PathVXLAN: rec}, Port: testPort, VXLANPort: 4789, Peers: func() []Peer { return list }})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { p.Run(ctx); close(done) }()
		const span = time.Minute
		time.Sleep(span)
		cancel()
		<-done

		lo, hi := time.Duration(float64(Interval)*(1-jitter))-tick, time.Duration(float64(Interval)*(1+jitter))+tick
		perTick := map[time.Time]int{}
		for a, at := range rec.at {
			for i := 1; i < len(at); i++ {
				if gap := at[i].Sub(at[i-1]); gap < lo || gap > hi {
					t.Fatalf("peer %s probed %v after its previous probe, outside [%v, %v]", a, gap, lo, hi)
				}
			}
			for _, x := range at {
				perTick[x]++
			}
		}
		busiest := 0
		for _, n := range perTick {
			busiest = max(busiest, n)
		}
		for _, s := range p.Status() {
			if s.State != StateUp {
				t.Fatalf("%s: %s on a healthy net", s.Peer, s.State)
			}
		}
		perPeer := float64(rec.bytes) / peers / span.Seconds()
		// Each probe is one datagram of the network's MTU plus 50 bytes of
		// VXLAN and outer headers; each answer 16+28+50.
		wire := float64(rec.sent) * (1450 + 50 + 16 + 28 + 50) / peers / span.Seconds()
		t.Logf("%d peers for %v: %d probes (%.2f per peer per second), busiest tick %d probes; UDP payload %.0f B/s per peer, on the wire with answers %.0f B/s per peer (%.0f kB/s for all %d)",
			peers, span, rec.sent, float64(rec.sent)/peers/span.Seconds(), busiest, perPeer, wire, wire*peers/1000, peers)
		if want := peers * int(span/Interval); rec.sent > want*12/10 {
			t.Errorf("%d probes, over the bound of %d", rec.sent, want*12/10)
		}
		if spread := peers * int(tick) / int(Interval) * 3; busiest > spread {
			t.Errorf("%d probes in one tick: not spread out (at most %d)", busiest, spread)
		}
	})
}

// recordConn notes when each probe went to whom.
type recordConn struct {
	Conn
	at    map[netip.Addr][]time.Time
	sent  int
	bytes int
}

func (r *recordConn) WriteToUDPAddrPort(b []byte, to netip.AddrPort) (int, error) {
	if m, err := parseMessage(b); err == nil && m.kind == kindProbe {
		r.at[to.Addr()] = append(r.at[to.Addr()], time.Now())
		r.sent++
		r.bytes += len(b)
	}
	return r.Conn.WriteToUDPAddrPort(b, to)
}

func TestOlderPeersAreNotProbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		c := fn.conn(netip.MustParseAddrPort("10.0.0.1:4799"), PathVXLAN)
		old := netip.MustParseAddr("10.0.0.2")
		p := New(Config{Conns: map[Path]Conn{PathVXLAN: c}, Port: testPort,
			Peers: func() []Peer { return []Peer{{VTEP: old, MTU: 1450}} },
			Known: func() map[netip.Addr]Known { return map[netip.Addr]Known{old: {Old: true}} }})
		ctx, cancel := context.WithCancel(context.Background())
		go p.Run(ctx)
		time.Sleep(30 * time.Second)
		cancel()
		st := p.Status()
		if len(st) != 1 || st[0].State != StateUnprobed || st[0].Sent != 0 {
			t.Fatalf("a peer without a health endpoint: %+v", st)
		}
	})
}

func TestHostileDatagramsAreIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fn := newFakeNet()
		self := netip.MustParseAddrPort("10.0.0.1:4799")
		c := fn.conn(self, PathVXLAN)
		p := New(Config{Conns: map[Path]Conn{PathVXLAN: c}, Port: testPort, Peers: func() []Peer { return nil }})
		ctx, cancel := context.WithCancel(context.Background())
		go p.Run(ctx)
		evil := fn.conn(netip.MustParseAddrPort("10.0.0.9:4799"), PathVXLAN)
		for i, b := range [][]byte{nil, {1}, []byte("ovhc"), append([]byte("ovhc\x07"), make([]byte, 20)...),
			appendMessage(nil, message{kind: kindReply, seq: 1}, 0), appendMessage(nil, message{kind: kindReply, seq: 1 << 60}, 3000)} {
			if _, err := evil.WriteToUDPAddrPort(b, self); err != nil {
				t.Fatal(i, err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case d := <-evil.in:
			t.Errorf("answered a hostile datagram: %q", fmt.Sprint(d.b))
		default:
		}
		cancel()
	})
}
