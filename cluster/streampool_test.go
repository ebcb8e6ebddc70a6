package cluster

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestStreamsShareASession: three nodes on loopback, with a secret and
// without, one of them of release 0.1.0's wire range. Bursts of records
// pushed from n1 reach both others: n2 over one channel, dialing no
// session for them, n3, which speaks only wire version 2 and never sees a
// session preface or a channel, over a connection per push. n2
// restarting ends its channel: the new instance gets the records over a
// new one.
func TestStreamsShareASession(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: binds loopback sockets")
	}
	for _, key := range [][]byte{nil, testKey} {
		name := map[bool]string{true: "secret", false: "no secret"}[key != nil]
		t.Run(name, func(t *testing.T) { sharedSessions(t, key) })
	}
}

func sharedSessions(t *testing.T, key []byte) {
	start := func(name, ip string, wire [2]byte, join ...string) (*Cluster, *recSink) {
		sink := newRecSink()
		c, err := New(Config{NodeName: name, BindAddr: ip, AdvertiseAddr: netip.MustParseAddr(ip), SecretKey: key,
			Sink: sink, Logger: testLogger(), Join: join, wireRange: wire})
		if err != nil {
			t.Fatal(err)
		}
		c.NetworkAdded(netA)
		return c, sink
	}
	n1, _ := start("n1", "127.0.0.1", [2]byte{})
	defer n1.Close()
	seed := fmt.Sprintf("127.0.0.1:%d", n1.ml.LocalNode().Port)
	n2, sink2 := start("n2", "127.0.0.2", [2]byte{}, seed)
	n3, sink3 := start("n3", "127.0.0.3", [2]byte{wireMin, wireMin}, seed)
	defer n3.Close()
	waitFor(t, 10*time.Second, "three members", holds(func() bool { return aliveMembers(n1) == 3 && aliveMembers(n2) == 3 }))

	const bursts, per = 20, 10
	publish := func(from int) {
		for b := range bursts {
			for i := range per {
				n1.Publish(netA, testPeer(fmt.Sprintf("e%d", from+b*per+i), i))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	has := func(sink *recSink, n int) func() bool { return func() bool { return len(sink.get(netA)) == n } }
	s0 := n1.Stats()
	publish(0)
	waitFor(t, 10*time.Second, "n2 and n3 hold every record", holds(func() bool { return has(sink2, bursts*per)() && has(sink3, bursts*per)() }))
	s1 := n1.Stats()
	t.Logf("n1: %d sessions dialed, %d streams over sessions, %d on connections of their own",
		s1.SessionsDialed-s0.SessionsDialed, s1.StreamsOverSessions-s0.StreamsOverSessions, s1.StreamsOwnConnection-s0.StreamsOwnConnection)
	if d := s1.SessionsDialed - s0.SessionsDialed; d > 1 {
		t.Errorf("n1 dialed %d sessions for its bursts, want at most one (to n2)", d)
	}
	if m := s1.StreamsOverSessions - s0.StreamsOverSessions; m > bursts/4 {
		t.Errorf("%d streams opened over sessions for %d pushes to n2: they should share a channel", m, bursts)
	}
	if d := s1.ChannelsDialed - s0.ChannelsDialed; d > 1 {
		t.Errorf("n1 dialed %d channels for its bursts, want at most one (to n2)", d)
	}
	if p := s1.StreamsOwnConnection - s0.StreamsOwnConnection; p < bursts/2 {
		t.Errorf("%d streams had a connection of their own, want most of n3's %d pushes", p, bursts)
	}
	if r := n3.Stats().Rejections(); r["unknown_type"]+r["malformed"] != 0 {
		t.Errorf("n3 (wire version 2) refused input: %v", r)
	}

	// n2 restarts: its session ends, the new instance gets every record
	// over a new one.
	n2.Close()
	n2, sink2 = start("n2", "127.0.0.2", [2]byte{}, seed)
	defer n2.Close()
	waitFor(t, 10*time.Second, "the new n2 holds every record", holds(has(sink2, bursts*per)))
	publish(bursts * per)
	waitFor(t, 10*time.Second, "the new n2 holds the new records", holds(has(sink2, 2*bursts*per)))
	if r := n2.Stats().Rejections(); r["unknown_type"]+r["malformed"]+r["decrypt"] != 0 {
		t.Errorf("the new n2 refused input: %v", r)
	}
}

// TestRefusedSessionFallsBack: an address that closes on the session
// preface (a node that does not take n1 for a member yet) gets the stream
// on a connection of its own, at once and for muxRetry; nothing is lost.
func TestRefusedSessionFallsBack(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				first := make([]byte, 1)
				if _, err := io.ReadFull(c, first); err != nil {
					return
				}
				if first[0] == muxPreface {
					got <- first[:1] // and close: refused
					return
				}
				b, _ := io.ReadAll(c)
				got <- append(first, b...)
			}()
		}
	}()
	mc := memberlist.DefaultLANConfig()
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.Logger = log.New(io.Discard, "", 0)
	tr, err := newAbortableTransport(t.Context(), mc)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	p := newStreamPool(t.Context(), tr.dialPlain, func(string) bool { return true }, mc.Logger)
	self := "127.0.0.1:7946"
	p.self.Store(&self)
	p.serve = func(*session) { t.Error("a refused session served") }
	addr := ln.Addr().String()
	for i := range 2 {
		c, err := p.open("peer", addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("message"))
		c.Close()
		want := "message"
		if i == 0 {
			// The refused preface.
			if b := <-got; string(b) != string([]byte{muxPreface}) {
				t.Fatalf("first connection carried %q, want the preface alone", b)
			}
		}
		if b := <-got; string(b) != want {
			t.Fatalf("stream %d carried %q, want %q", i, b, want)
		}
	}
	if p.dialed.Load() != 0 || p.plainDials.Load() != 2 {
		t.Errorf("sessions dialed %d, connections dialed %d; want 0 and 2 (one per stream, the second without trying a session again)", p.dialed.Load(), p.plainDials.Load())
	}
}
