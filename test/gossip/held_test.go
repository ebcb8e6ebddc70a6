package gossip

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// The bounds on accepted gossip streams, as README's Security section
// states them (cluster/screen.go): a stream's whole first message within
// headWait, at most perSource waiting from one address and strangers from
// non-members in all.
const (
	headWait  = 5 * time.Second
	perSource = 8
	strangers = 256
)

const (
	held        = 500              // connections the outsider holds at once
	sources     = 50               // its addresses
	floodFor    = 12 * time.Second // how long it keeps them held, redialling
	redialEvery = 500 * time.Millisecond
)

// TestHeldGossipConnections: an outsider on the underlay holds 500 TCP
// connections to h1's gossip port, from 50 addresses, and dials again
// whenever h1 closes one, for 12 s. Some send nothing, some the start of a
// message (a type byte, a header cut short) and stop. h1's descriptors and
// goroutines stay bounded (the connections waiting for their first
// message, at most 256, and those closed at once), its log says so in a
// handful of lines and no ERROR, memberlist never sees one of the streams,
// every connection is counted (stream_limit or stream_idle, together as
// many as the outsider opened), and meanwhile endpoints joined on h1 and on
// h2 reach every host. With a cluster secret and without.
func TestHeldGossipConnections(t *testing.T) {
	requireTestbed(t)
	t.Run("Secret", func(t *testing.T) { testHeldConnections(t, true) })
	t.Run("NoSecret", func(t *testing.T) { testHeldConnections(t, false) })
}

func testHeldConnections(t *testing.T, secret bool) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: secret}})
	h1, h2 := c.Nodes[0], c.Nodes[1]
	c.waitMembers(converge, "three hosts")

	out, err := c.Topo.AddOutsider()
	if err != nil {
		t.Fatal(err)
	}
	var srcs []netip.Addr
	for i := range sources {
		a := testbed.Nth(testbed.UnderlayIPv4, 200+i)
		if _, err := out.NS.IP("addr", "add", netip.PrefixFrom(a, testbed.UnderlayIPv4.Bits()).String(), "dev", testbed.HostLink); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, a)
	}
	// What a held connection sends before it stops: nothing, a type byte
	// memberlist takes, or a message's start.
	starts := [][]byte{nil, {8}, {8, 0x81, 0xaa}} // user message; its header map, a key of 10 bytes cut short
	if secret {
		starts = [][]byte{nil, {10}, {10, 0, 0}} // encrypted; its length cut short
	}

	idle0, limit0 := rejected(t, h1, "stream_idle"), rejected(t, h1, "stream_limit")
	fds0, err := h1.Plugin.OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	gor0, err := goroutines(h1)
	if err != nil {
		t.Fatal(err)
	}
	log0 := len(h1.Plugin.Log())
	f := &flood{out: out, dst: netip.AddrPortFrom(h1.Underlay, testbed.GossipPort), srcs: srcs, starts: starts}

	// From one address first: perSource wait, the rest are closed at once.
	if err := f.dial(seq(0, firstFromOne)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h1, "stream_limit", limit0+firstFromOne-perSource)
	// The rest from the other addresses: strangers wait in all. (The
	// dialling takes well under headWait, so none has timed out yet.)
	dialing := time.Now()
	if err := f.dial(seq(firstFromOne, held)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, h1, "stream_limit", limit0+held-strangers)
	t.Logf("%d connections opened and %d of them closed at once in %v", held, held-strangers, time.Since(dialing).Round(time.Millisecond))

	// While the outsider redials what h1 closes, h1's use is sampled and
	// gossip between the members goes on.
	stop := make(chan struct{})
	var bg sync.WaitGroup
	var stopping sync.Once
	halt := func() { stopping.Do(func() { close(stop) }); bg.Wait() }
	defer halt() // a failure below ends the flood before the cluster goes
	bg.Go(func() {
		if err := f.redial(stop); err != nil {
			t.Errorf("outsider: %v", err)
		}
	})
	var peak struct{ fds, gor int }
	bg.Go(func() {
		for {
			fds, err := h1.Plugin.OpenFDs()
			gor, gerr := goroutines(h1)
			if err != nil || gerr != nil {
				t.Errorf("h1 during the flood: %v, %v", err, gerr)
				return
			}
			peak.fds, peak.gor = max(peak.fds, fds), max(peak.gor, gor)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	started := time.Now()
	c.addContainer(h1, "f1")
	c.addContainer(h2, "f2")
	took := c.waitConverged(converge, "endpoints joined on h1 and h2 during the flood")
	c.waitMembers(heal, "every member alive during the flood")
	time.Sleep(floodFor - time.Since(started))
	halt()

	// Every connection ends, closed by h1: at once, or when its wait is up.
	opened := f.wait(t, headWait+5*time.Second)
	idle, limit := rejected(t, h1, "stream_idle")-idle0, rejected(t, h1, "stream_limit")-limit0
	if idle+limit != uint64(opened) {
		t.Errorf("the outsider opened %d connections; h1 counts %d closed at once and %d timed out", opened, limit, idle)
	}
	if idle < strangers {
		t.Errorf("%d connections timed out, want at least %d", idle, strangers)
	}
	fdsBound, gorBound := fds0+strangers+64, gor0+strangers+64
	if peak.fds > fdsBound {
		t.Errorf("h1 held %d descriptors (%d before the flood), want at most %d", peak.fds, fds0, fdsBound)
	}
	if peak.gor > gorBound {
		t.Errorf("h1 ran %d goroutines (%d before the flood), want at most %d", peak.gor, gor0, gorBound)
	}
	wait.For(t, 5*time.Second, 100*time.Millisecond, "h1 back to its descriptors and goroutines", func() error {
		fds, err := h1.Plugin.OpenFDs()
		if err != nil {
			return err
		}
		gor, err := goroutines(h1)
		if err != nil {
			return err
		}
		if fds > fds0+10 || gor > gor0+20 {
			return fmt.Errorf("%d descriptors (%d before), %d goroutines (%d before)", fds, fds0, gor, gor0)
		}
		return nil
	})

	logged := h1.Plugin.Log()[log0:]
	var lines, errorLines []string
	outsider := map[string]bool{}
	for _, a := range srcs {
		outsider[a.String()] = true
	}
	streamFrom := regexp.MustCompile(`Stream connection from=([^ "]+):\d+`) // memberlist's, at debug
	for line := range strings.Lines(logged) {
		switch m := streamFrom.FindStringSubmatch(line); {
		case strings.Contains(line, "reason=stream_"):
			lines = append(lines, line)
		case strings.Contains(line, "level=ERROR"):
			errorLines = append(errorLines, line)
		case m != nil && outsider[m[1]]:
			t.Errorf("memberlist got a stream of the outsider: %s", line)
		}
	}
	switch {
	case len(lines) == 0 || len(lines) > 8:
		t.Errorf("h1 logged %d lines of the refusals, want a handful:\n%s", len(lines), strings.Join(lines, ""))
	case !strings.Contains(lines[0], fmt.Sprintf("%d streams from %s", perSource, srcs[0])):
		t.Errorf("the first refusal logged is not of the bound per address: %s", lines[0])
	}
	if len(errorLines) > 0 {
		t.Errorf("h1 logged %d ERROR lines:\n%s", len(errorLines), strings.Join(errorLines, ""))
	}
	c.checkNow("after the flood")
	t.Logf("%d connections held for %v from %d addresses: %d closed at once, %d timed out; h1's peak %d descriptors (%d before), %d goroutines (%d before); %d log lines, 0 ERROR; endpoints joined during the flood converged in %v",
		opened, floodFor, sources, limit, idle, peak.fds, fds0, peak.gor, gor0, len(lines), took.Round(time.Millisecond))
	t.Logf("the refusals' log lines:\n%s", strings.Join(lines, ""))
}

// flood is the outsider's connections to dst: each slot holds one, and is
// dialled again once h1 closes it. The first firstFromOne slots are of
// srcs[0], the others of the other addresses in turn.
type flood struct {
	out    *testbed.Host
	dst    netip.AddrPort
	srcs   []netip.Addr
	starts [][]byte

	// mu guards closed and opened; a leaf lock.
	mu     sync.Mutex
	closed []int // slots whose connection h1 closed
	opened int
	ended  sync.WaitGroup // a connection's watcher
}

const firstFromOne = 20

func (f *flood) srcOf(slot int) netip.Addr {
	if slot < firstFromOne {
		return f.srcs[0]
	}
	return f.srcs[1+slot%(len(f.srcs)-1)]
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// dial opens the slots' connections in the outsider's namespace, and has
// each send its start and wait until h1 closes it.
func (f *flood) dial(slots []int) error {
	return f.out.NS.Do(func() error {
		for _, i := range slots {
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.srcOf(i), 0)), Timeout: 5 * time.Second}
			conn, err := d.Dial("tcp", f.dst.String())
			if err != nil {
				return fmt.Errorf("connection %d from %s: %w", i, f.srcOf(i), err)
			}
			f.mu.Lock()
			f.opened++
			f.mu.Unlock()
			f.ended.Add(1)
			go f.watch(i, conn)
		}
		return nil
	})
}

// watch sends slot i's start and waits for h1 to close the connection.
func (f *flood) watch(i int, conn net.Conn) {
	defer f.ended.Done()
	defer conn.Close()
	if s := f.starts[i%len(f.starts)]; len(s) > 0 {
		conn.Write(s) // h1 may have closed it already: no matter
	}
	io.Copy(io.Discard, conn)
	f.mu.Lock()
	f.closed = append(f.closed, i)
	f.mu.Unlock()
}

// redial dials the slots h1 closed again, every redialEvery, until stop.
func (f *flood) redial(stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case <-time.After(redialEvery):
		}
		f.mu.Lock()
		slots := f.closed
		f.closed = nil
		f.mu.Unlock()
		if err := f.dial(slots); err != nil {
			return err
		}
	}
}

// wait waits until h1 closed every connection, and returns how many the
// outsider opened.
func (f *flood) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { f.ended.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatalf("h1 still holds some of the outsider's connections %v after the flood", timeout)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened
}

// rejected reads overlay_plugin_gossip_rejected_total of reason.
func rejected(t *testing.T, n *testbed.Node, reason string) uint64 {
	t.Helper()
	v, err := n.Plugin.Metric(`overlay_plugin_gossip_rejected_total{reason="` + reason + `"}`)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(v)
}

// waitCount waits until n counts want refusals of reason.
func waitCount(t *testing.T, n *testbed.Node, reason string, want uint64) {
	t.Helper()
	wait.For(t, 5*time.Second, 20*time.Millisecond, reason+" counted", func() error {
		if got := rejected(t, n, reason); got != want {
			return fmt.Errorf("%s counts %d, want %d", n.Name, got, want)
		}
		return nil
	})
}

// goroutines reads n's go_goroutines.
func goroutines(n *testbed.Node) (int, error) {
	v, err := n.Plugin.Metric("go_goroutines")
	return int(v), err
}
