package gossip

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
	"github.com/overlay-plugin/overlay-plugin/vxlanfilter"
)

const (
	streamEvery = 10 * time.Millisecond // 100 datagrams a second per stream
	streamPort  = 7100
	forgedPort  = 9999 // where the outsider's frames aim, in c1
	forgedEvery = 10 * time.Millisecond
)

// TestSourceFilter: an outsider on the underlay sends crafted VXLAN (the
// network's VNI, a container's MAC and address, UDP inside) at 100/s into
// an unencrypted network; the container gets none and the host counts
// each as dropped. Meanwhile three numbered streams between the three
// hosts' containers lose nothing while a fourth host joins, while one
// plugin restarts and while one member's gossip is cut off and healed
// (its VXLAN still flowing: it is admitted as the host of remote
// endpoints, not only as a member).
func TestSourceFilter(t *testing.T) {
	requireTestbed(t)
	const grace = 60 * time.Second
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{DeadGrace: grace}})
	eps := c.withContainers()
	h1, h2, h3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	c1 := eps[0]

	// The outsider's target: a listener in c1 counts what gets through.
	var through atomic.Int64
	out, frame, ln := c.forgery(c1)
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := ln.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			through.Add(1)
		}
	}()
	stopForging := make(chan struct{})
	var forged atomic.Int64
	var forging sync.WaitGroup
	forging.Go(func() {
		for {
			select {
			case <-stopForging:
				return
			default:
			}
			n, err := out.NS.SendVXLAN(netip.AddrPortFrom(h1.Underlay, 4789), c.nw.VNI, frame, 10, forgedEvery)
			forged.Add(int64(n))
			if err != nil {
				t.Errorf("outsider: %v", err)
				return
			}
		}
	})

	// Member traffic: c1 → c2 → c3 → c1, numbered.
	var streams []*testbed.Stream
	for i := range eps {
		src, dst := eps[i], eps[(i+1)%len(eps)]
		s, err := testbed.StartStream(src.Ctr.Netns, dst.Ctr.Netns, addr(dst, testbed.IPv4), streamPort, streamEvery)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	stopped := false
	stopStreams := func() []testbed.StreamStats {
		stopped = true
		var out []testbed.StreamStats
		for _, s := range streams {
			out = append(out, s.Stop())
		}
		return out
	}
	defer func() {
		if !stopped {
			stopStreams()
		}
	}()
	time.Sleep(time.Second)

	// 1. A fourth host joins, with a container the others reach.
	h4, err := c.AddNode(c.nw)
	if err != nil {
		t.Fatal(err)
	}
	c4 := c.addContainer(h4, "c4")
	c.waitMembers(converge, "a fourth host joined")
	c.waitConverged(converge, "a fourth host joined")
	c.checkTraffic([]*testbed.Endpoint{c1, c4}, false)
	t.Logf("h4 joined; c1 and c4 reach each other")

	// 2. h2's plugin restarts (SIGTERM, as docker plugin disable does),
	// and finds no filter table to take over, as after an upgrade from
	// 0.1.0: its sandbox's entries say whom to admit.
	if err := h2.Plugin.HoldSandboxes(); err != nil {
		t.Fatal(err)
	}
	if err := h2.Plugin.Stop(0); err != nil {
		t.Fatal(err)
	}
	if err := testbed.DelNftTable(h2.NS.Path(), vxlanfilter.DefaultTable); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(h2); err != nil {
		t.Fatal(err)
	}
	if err := c.Enable(h2); err != nil {
		t.Fatal(err)
	}
	c.waitMembers(converge, "h2's plugin restarted")
	c.waitConverged(converge, "h2's plugin restarted")
	t.Logf("h2's plugin restarted")

	// 3. h3's gossip is cut off (its data path is not): the others find it
	// gone, keep its endpoints for the grace, and keep admitting it.
	heal := c.cutGossip(h3)
	for _, obs := range []*testbed.Node{h1, h2} {
		c.waitNotAlive(obs, h3.Name, 30*time.Second)
	}
	time.Sleep(2 * time.Second) // traffic flows through the partition
	heal()
	c.waitMembers(converge, "h3's gossip healed")
	c.waitConverged(converge, "h3's gossip healed")
	time.Sleep(time.Second)

	close(stopForging)
	forging.Wait()
	var lost []string
	for i, st := range stopStreams() {
		t.Logf("stream %s → %s: %s", eps[i], eps[(i+1)%len(eps)], st)
		if st.Sent == 0 || len(st.Lost) != 0 || st.Received != st.Sent {
			lost = append(lost, fmt.Sprintf("%s → %s: %s", eps[i], eps[(i+1)%len(eps)], st))
		}
	}
	if len(lost) != 0 {
		c.fatalf("member traffic lost:\n  %s", strings.Join(lost, "\n  "))
	}

	// Every forged frame was dropped at h1, and counted there.
	sent := uint64(forged.Load())
	err = wait.Until(2*time.Second, 50*time.Millisecond, func() error {
		st, err := h1.Plugin.Network(c.nw.ID)
		if err != nil {
			return err
		}
		if st.VXLANFilter == nil || st.VXLANFilter.Dropped != sent {
			return fmt.Errorf("h1 counts %+v dropped, the outsider sent %d", st.VXLANFilter, sent)
		}
		return nil
	})
	if err != nil {
		c.fatalf("%v", err)
	}
	if n := through.Load(); n != 0 {
		c.fatalf("%d of the outsider's %d frames reached c1", n, sent)
	}
	t.Logf("outsider: %d frames sent, 0 through, %d counted dropped at h1", sent, sent)
}

// TestForgedVXLANWithoutFilter is the control: with --vxlan-filter=false
// the outsider's frames do reach the container, so the test above
// measures the filter and not a broken forgery.
func TestForgedVXLANWithoutFilter(t *testing.T) {
	requireTestbed(t)
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Hosts: 2, Plugin: testbed.PluginConfig{Args: []string{"--vxlan-filter=false"}}}})
	c1 := c.withContainers()[0]
	out, frame, ln := c.forgery(c1)
	if _, err := out.NS.SendVXLAN(netip.AddrPortFrom(c.Nodes[0].Underlay, 4789), c.nw.VNI, frame, 5, forgedEvery); err != nil {
		t.Fatal(err)
	}
	ln.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64)
	n, from, err := ln.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no forged frame reached c1 without the filter: %v", err)
	}
	if string(buf[:n]) != "forged" {
		t.Fatalf("c1 got %q from %v", buf[:n], from)
	}
	t.Logf("without the filter a forged frame from the outsider reached c1 (inner source %v)", from)
}

// forgery is an outsider on the underlay, the frame it forges for ep (the
// network's VNI is the caller's to add: SendVXLAN), and a listener in ep's
// container where the frame aims, closed when the test ends.
func (c *gcluster) forgery(ep *testbed.Endpoint) (*testbed.Host, testbed.InnerFrame, *net.UDPConn) {
	c.t.Helper()
	ln, err := ep.Ctr.ListenUDP(netip.AddrPortFrom(addr(ep, testbed.IPv4), forgedPort))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { ln.Close() })
	out, err := c.Topo.AddOutsider()
	if err != nil {
		c.t.Fatal(err)
	}
	mac, err := net.ParseMAC(ep.MAC)
	if err != nil {
		c.t.Fatal(err)
	}
	frame := testbed.InnerFrame{DstMAC: mac, DstIP: addr(ep, testbed.IPv4), SrcIP: testbed.Nth(c.nw.Pool4, 200),
		DstPort: forgedPort, Payload: []byte("forged")}
	return out, frame, ln
}

// cutGossip drops n's gossip (TCP and UDP to and from the gossip port)
// while its data path stays up; heal undoes it, as the test's end does.
func (c *gcluster) cutGossip(n *testbed.Node) (heal func()) {
	c.t.Helper()
	const table = "gossiptest_cut"
	if err := testbed.NftDropPort(n.NS.Path(), table, testbed.GossipPort); err != nil {
		c.t.Fatal(err)
	}
	var once sync.Once
	undo := func() error {
		var err error
		once.Do(func() { err = testbed.DelNftTable(n.NS.Path(), table) })
		return err
	}
	c.t.Cleanup(func() { _ = undo() })
	return func() {
		c.t.Helper()
		if err := undo(); err != nil {
			c.t.Fatal(err)
		}
	}
}
