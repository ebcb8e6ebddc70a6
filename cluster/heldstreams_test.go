package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Accepted streams that send nothing are refused after headWait and never
// reach memberlist; past maxPendingStreams at once from non-members (pipes
// have no address, so no bound by source) the rest are closed at once;
// every one is counted, and a good stream still goes through.
func TestScreenBoundsHeldStreams(t *testing.T) {
	ft, rs := newFakeTransport(), &refusals{}
	g := newScreenTransport(ft, newKeyring(nil), rs.refuse, nil)
	g.headWait = 300 * time.Millisecond
	defer g.Shutdown()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range maxPendingStreams + 10 {
		near, far := net.Pipe()
		held = append(held, far)
		ft.streams <- near
	}
	rs.wait(t, RejectStreamLimit, 10)
	rs.wait(t, RejectStreamIdle, maxPendingStreams)
	select {
	case c := <-g.StreamCh():
		t.Fatalf("memberlist got a held stream from %v", c.RemoteAddr())
	default:
	}
	user := plainUser(t, bytes.Repeat([]byte{0x42}, 100))
	near, far := net.Pipe()
	go func() { far.Write(user); far.Close() }()
	ft.streams <- near
	if got := readAll(<-g.StreamCh()); !bytes.Equal(got, user) {
		t.Fatalf("a good stream after the held ones read back as %d bytes, sent %d", len(got), len(user))
	}
}

// 500 TCP connections held open to a member's gossip port, with a
// secret and without: the member's file descriptors and goroutines stay
// bounded, a handful of log lines say so, every connection is counted, and
// gossip between the members goes on meanwhile.
func TestHeldConnectionsToTheGossipPort(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: opens 500 loopback connections and waits for them to time out")
	}
	for _, key := range [][]byte{testKey, nil} {
		name := map[bool]string{true: "secret", false: "no secret"}[key != nil]
		t.Run(name, func(t *testing.T) { heldConnections(t, key) })
	}
}

func heldConnections(t *testing.T, key []byte) {
	var logs logBuf
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	sink1, sink2 := newRecSink(), newRecSink()
	n1, err := New(Config{NodeName: "n1", BindAddr: "127.0.0.1", AdvertiseAddr: netip.MustParseAddr("127.0.0.1"),
		SecretKey: key, Sink: sink1, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	port := n1.ml.LocalNode().Port
	n2, err := New(Config{NodeName: "n2", BindAddr: "127.0.0.2", AdvertiseAddr: netip.MustParseAddr("127.0.0.2"),
		SecretKey: key, Sink: sink2, Logger: testLogger(), Join: []string{fmt.Sprintf("127.0.0.1:%d", port)}})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	n1.NetworkAdded(netA)
	n2.NetworkAdded(netA)
	waitFor(t, 10*time.Second, "n2 joined", holds(func() bool { return len(n1.ml.Members()) == 2 }))

	fds0, gor0 := openFDs(t), runtime.NumGoroutine()
	const held = 500
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// From 50 loopback addresses, 10 each: past 8 from one address, and
	// past maxPendingStreams from strangers, they are closed at once. Every
	// other one sends the start of a message and stops: a type byte that
	// memberlist would take (without a key it once took the stream).
	start := []byte{mlUser}
	if key != nil {
		start = []byte{mlEncrypt, 0, 0}
	}
	for i := range held {
		src := &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i%50))}
		c, err := (&net.Dialer{LocalAddr: src}).Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		if i%2 == 1 {
			c.Write(start) // refused at once over the bound: no matter
		}
		conns = append(conns, c)
	}
	// The member's own share: the test holds one descriptor a connection.
	waitFor(t, 5*time.Second, "the connections over the bound closed", holds(func() bool {
		return n1.Stats().RejectedStreamLimit >= held-maxPendingStreams
	}))
	if fds := openFDs(t) - fds0 - held; fds > maxPendingStreams+20 {
		t.Errorf("the member holds %d more descriptors for %d held connections, want at most %d", fds, held, maxPendingStreams+20)
	}
	if g := runtime.NumGoroutine() - gor0; g > maxPendingStreams+40 {
		t.Errorf("%d more goroutines for %d held connections, want at most %d", g, held, maxPendingStreams+40)
	}
	n2.Publish(netA, testPeer("e2", 2))
	waitFor(t, 10*time.Second, "gossip between the members while connections are held", holds(func() bool {
		_, ok := sink1.get(netA)["e2"]
		return ok
	}))
	waitFor(t, streamHeadWait+5*time.Second, "every held connection counted", func() error {
		if s := n1.Stats(); s.RejectedStreamLimit+s.RejectedStreamIdle != held {
			return fmt.Errorf("%d over the bound, %d timed out", s.RejectedStreamLimit, s.RejectedStreamIdle)
		}
		return nil
	})
	lines := 0
	for _, l := range strings.Split(logs.tail(1000), "\n") {
		if strings.Contains(l, "reason=stream_") {
			lines++
		}
		if strings.Contains(l, "level=ERROR") {
			t.Errorf("an ERROR line: %s", l)
		}
	}
	if lines == 0 || lines > 6 {
		t.Errorf("%d log lines for %d held connections, want a handful:\n%s", lines, held, logs.tail(1000))
	}
	s := n1.Stats()
	t.Logf("%d held connections: %d closed over the bound, %d timed out; %d log lines", held, s.RejectedStreamLimit, s.RejectedStreamIdle, lines)
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// holds turns a condition into waitFor's.
func holds(ok func() bool) func() error {
	return func() error {
		if ok() {
			return nil
		}
		return errors.New("not yet")
	}
}
