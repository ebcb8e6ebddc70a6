package cluster

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChannelMessagesAreChecked: a channel's messages reach the delegate
// one by one, two written at once included, each checked as a stream's
// first message is; the first that fails the check (another key, an
// unknown type) is counted, ends the channel, and nothing after it is
// delivered. memberlist never gets the stream.
func TestChannelMessagesAreChecked(t *testing.T) {
	otherKey := bytes.Repeat([]byte{9}, 32)
	for _, c := range []struct {
		name    string
		key     []byte
		hostile []byte
		reason  Reason
	}{
		{"no secret", nil, plainStream(0x42, []byte{1, 2, 3}), RejectUnknownType},
		{"secret", testKey, streamMessage([]byte("forged"), otherKey), RejectDecrypt},
	} {
		t.Run(c.name, func(t *testing.T) {
			ac := acceptChannel(t, c.key)
			both := append(streamMessage([]byte("one"), c.key), streamMessage([]byte("two"), c.key)...)
			go func() {
				ac.far.Write(both)
				ac.far.Write(c.hostile)
				ac.far.Write(streamMessage([]byte("three"), c.key))
			}()
			ac.rs.wait(t, c.reason, 1)
			if _, err := ac.far.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after the refused message the channel reads %v, want EOF", err)
			}
			if got := ac.delivered(); len(got) != 2 || string(got[0]) != "one" || string(got[1]) != "two" {
				t.Errorf("delivered %q, want one and two", got)
			}
			select {
			case s := <-ac.g.StreamCh():
				t.Errorf("memberlist got the channel's stream from %v", s.RemoteAddr())
			default:
			}
		})
	}
}

// TestChannelCutShort: a channel whose member stops in the middle of a
// message (its process ended mid-send) ends quietly: what came before is
// delivered, and nothing is counted as refused.
func TestChannelCutShort(t *testing.T) {
	for _, key := range [][]byte{nil, testKey} {
		ac := acceptChannel(t, key)
		two := streamMessage([]byte("two"), key)
		ac.far.Write(append(streamMessage([]byte("one"), key), two[:len(two)-2]...))
		ac.far.Close()
		waitFor(t, 5*time.Second, "the channel ended", holds(func() bool { return ac.ended.Load() }))
		if got := ac.delivered(); len(got) != 1 || string(got[0]) != "one" {
			t.Errorf("delivered %q, want one", got)
		}
		for r := range Reason(numReasons) {
			if n := ac.rs.get(r); n != 0 {
				t.Errorf("%d refused as %v", n, r)
			}
		}
	}
}

// TestChannelFromStrangerClosed: a channel opened from an address that is
// no member's (a node back from a restart, before the member took in its
// alive message) is closed unanswered: the dialer falls back to a
// connection per message, memberlist never gets the opening message (it
// would refuse it as malformed), and nothing is counted.
func TestChannelFromStrangerClosed(t *testing.T) {
	ft, rs := newFakeTransport(), &refusals{}
	g := newScreenTransport(ft, newKeyring(nil), rs.refuse, func(netip.Addr) bool { return false })
	defer g.Shutdown()
	g.channels = channelSink{
		from:    func(netip.AddrPort, netip.Addr) (string, bool) { return "far", true },
		taken:   func(string, net.Conn) { t.Error("a stranger's channel taken") },
		ended:   func(string, net.Conn) {},
		deliver: func([]byte) { t.Error("a stranger's channel delivered") },
	}
	g.sessionLog.Store(log.New(io.Discard, "", 0))
	near, far := net.Pipe()
	defer far.Close()
	ft.streams <- near
	if err := openChannel(far, nil, channelOpenFrom("10.0.0.9:7946"), time.Now().Add(5*time.Second)); err == nil {
		t.Fatal("a stranger's channel answered")
	}
	select {
	case s := <-g.StreamCh():
		t.Errorf("memberlist got the channel's stream from %v", s.RemoteAddr())
	case <-time.After(100 * time.Millisecond):
	}
	for r := range Reason(numReasons) {
		if n := rs.get(r); n != 0 {
			t.Errorf("%d refused as %v", n, r)
		}
	}
}

// accepted is a channel accepted by a screen from far, opened.
type accepted struct {
	g     *screenTransport
	rs    *refusals
	far   net.Conn
	ended atomic.Bool
	mu    sync.Mutex // guards got; a leaf lock
	got   [][]byte
}

func (a *accepted) delivered() [][]byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

func acceptChannel(t *testing.T, key []byte) *accepted {
	t.Helper()
	ft, a := newFakeTransport(), &accepted{rs: &refusals{}}
	a.g = newScreenTransport(ft, newKeyring(key), a.rs.refuse, func(netip.Addr) bool { return true })
	t.Cleanup(func() { a.g.Shutdown() })
	a.g.channels = channelSink{
		from:  func(netip.AddrPort, netip.Addr) (string, bool) { return "far", true },
		taken: func(string, net.Conn) {}, ended: func(string, net.Conn) { a.ended.Store(true) },
		deliver: func(p []byte) {
			a.mu.Lock()
			a.got = append(a.got, bytes.Clone(p))
			a.mu.Unlock()
		},
	}
	a.g.sessionLog.Store(log.New(io.Discard, "", 0)) // publishes channels, as acceptSessions does
	near, far := net.Pipe()
	t.Cleanup(func() { far.Close() })
	ft.streams <- near
	if err := openChannel(far, key, channelOpenFrom("10.0.0.9:7946"), time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("open: %v", err)
	}
	a.far = far
	return a
}

// TestOneChannelPerPair: two nodes on loopback that send to each other
// at once, both dialing a channel. They end up on one connection, the one
// dialed by the lower name, used both ways; every record of both bursts
// arrives; later bursts go over that connection, dialing nothing.
func TestOneChannelPerPair(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: binds loopback sockets")
	}
	start := func(name, ip string, join ...string) (*Cluster, *recSink) {
		sink := newRecSink()
		c, err := New(Config{NodeName: name, BindAddr: ip, AdvertiseAddr: netip.MustParseAddr(ip),
			Sink: sink, Logger: testLogger(), Join: join})
		if err != nil {
			t.Fatal(err)
		}
		return c, sink
	}
	a, sinkA := start("a", "127.0.4.1")
	defer a.Close()
	b, sinkB := start("b", "127.0.4.2", fmt.Sprintf("127.0.4.1:%d", a.ml.LocalNode().Port))
	defer b.Close()
	waitFor(t, 10*time.Second, "two members", holds(func() bool { return aliveMembers(a) == 2 && aliveMembers(b) == 2 }))

	const per = 50
	burst := func(round int) {
		var wg sync.WaitGroup
		for i, c := range []*Cluster{a, b} {
			wg.Go(func() {
				for j := range per {
					c.Publish(netA, testPeer(fmt.Sprintf("e%s%dx%d", c.name, round, j), i*per+j))
				}
			})
		}
		wg.Wait()
		n := (round + 1) * per
		waitFor(t, 10*time.Second, "both hold the other's records", func() error {
			if ga, gb := len(sinkA.get(netA)), len(sinkB.get(netA)); ga != n || gb != n {
				return fmt.Errorf("a holds %d, b %d, want %d", ga, gb, n)
			}
			return nil
		})
	}
	a.NetworkAdded(netA)
	b.NetworkAdded(netA)
	burst(0)

	conns := func(c *Cluster, other string) (send net.Conn, all int) {
		c.chMu.Lock()
		defer c.chMu.Unlock()
		pc := c.channels[other]
		if pc == nil {
			return nil, 0
		}
		if pc.send != nil {
			send = pc.send.conn
		}
		return send, len(pc.all)
	}
	var sa, sb net.Conn
	waitFor(t, 10*time.Second, "one connection between them", func() error {
		var na, nb int
		sa, na = conns(a, "b")
		sb, nb = conns(b, "a")
		if na != 1 || nb != 1 || sa == nil || sb == nil ||
			sa.LocalAddr().String() != sb.RemoteAddr().String() || sa.RemoteAddr().String() != sb.LocalAddr().String() {
			return fmt.Errorf("a holds %d, sends on %v; b holds %d, sends on %v", na, connString(sa), nb, connString(sb))
		}
		return nil
	})
	if ta, ok := sb.LocalAddr().(*net.TCPAddr); !ok || ta.Port != int(b.ml.LocalNode().Port) {
		t.Errorf("b sends on %v: want the connection a dialed (a's name is the lower)", sb.LocalAddr())
	}
	dialed := a.Stats().ChannelsDialed + b.Stats().ChannelsDialed
	for round := 1; round < 4; round++ {
		burst(round)
	}
	if d := a.Stats().ChannelsDialed + b.Stats().ChannelsDialed - dialed; d != 0 {
		t.Errorf("%d channels dialed after the first burst, want none", d)
	}
	if s, _ := conns(a, "b"); s != sa {
		t.Errorf("a's channel changed: %v, was %v", s, sa)
	}
}

func connString(c net.Conn) string {
	if c == nil {
		return "none"
	}
	return c.LocalAddr().String() + "->" + c.RemoteAddr().String()
}
