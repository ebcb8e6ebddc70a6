package driver

import (
	"net/netip"
	"slices"
	"sync"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// recordingCP is a control plane that records calls and serves a fixed
// snapshot.
type recordingCP struct {
	// mu guards all fields. Leaf lock, taken under network locks.
	mu        sync.Mutex
	published []string
	retracted []string
	added     []string
	removed   []string
	hints     []netip.Addr
	forgotten []netip.Addr
	// alone: Connected stays open (no other host reachable) until
	// connect is closed.
	alone    bool
	connect  chan struct{}
	snapshot []peerdb.Peer
	// live are the reachable hosts' VTEPs (Delivered).
	live map[netip.Addr]bool
}

func (c *recordingCP) Publish(nid string, p peerdb.Peer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published = append(c.published, nid+"/"+p.EndpointID)
}
func (c *recordingCP) Retract(nid, eid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retracted = append(c.retracted, nid+"/"+eid)
}
func (c *recordingCP) Snapshot(string) []peerdb.Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]peerdb.Peer, len(c.snapshot))
	for i, p := range c.snapshot {
		out[i] = p.Clone()
	}
	return out
}
func (c *recordingCP) NetworkAdded(nid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.added = append(c.added, nid)
}
func (c *recordingCP) NetworkRemoved(nid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed = append(c.removed, nid)
}
func (c *recordingCP) NodeHint(a netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hints = append(c.hints, a)
}

func (c *recordingCP) Connected() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.connect == nil {
		c.connect = make(chan struct{})
		if !c.alone {
			close(c.connect)
		}
	}
	return c.connect
}

func (c *recordingCP) Delivered(a netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live[a]
}

func (c *recordingCP) setLive(vteps ...netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live = map[netip.Addr]bool{}
	for _, v := range vteps {
		c.live[v] = true
	}
}

func (c *recordingCP) ForgetNode(a netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgotten = append(c.forgotten, a)
}

func TestControlPlaneHooks(t *testing.T) {
	d, k := newFake(t)
	cp := &recordingCP{snapshot: []peerdb.Peer{remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")}}
	d.SetControlPlane(cp)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	// A stale peer delivered earlier that the control plane no longer has.
	must(t, d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.2")))
	createJoined(t, d, "e1", 1)
	sb := k.Snapshot()["n1"]
	if len(sb.Neighbors) != 1 || sb.Neighbors[netip.MustParseAddr("10.1.0.50")] != cp.snapshot[0].MAC {
		t.Fatalf("sandbox not built from the control plane's snapshot: %v", sb.Neighbors)
	}
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: map[string]any{"Address": "198.51.100.7"}}))
	// A node removed from the swarm is not re-joined for ever.
	must(t, d.DiscoverDelete(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: map[string]any{"Address": "198.51.100.7"}}))
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e1"}))
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "e1"}))
	must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}))
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if !slices.Equal(cp.removed, []string{"n1"}) {
		t.Errorf("NetworkRemoved calls: %v", cp.removed)
	}
	if !slices.Equal(cp.forgotten, []netip.Addr{netip.MustParseAddr("198.51.100.7")}) {
		t.Errorf("ForgetNode calls: %v", cp.forgotten)
	}
	if !slices.Equal(cp.added, []string{"n1"}) || !slices.Equal(cp.published, []string{"n1/e1"}) ||
		!slices.Equal(cp.retracted, []string{"n1/e1"}) || !slices.Equal(cp.hints, []netip.Addr{netip.MustParseAddr("198.51.100.7")}) {
		t.Fatalf("hooks: added %v published %v retracted %v hints %v", cp.added, cp.published, cp.retracted, cp.hints)
	}
}

func TestLateControlPlaneLearnsExistingEndpoints(t *testing.T) {
	d, _ := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	_, err := d.CreateEndpoint(endpointReq("n1", "e2", 2)) // not joined: not published
	must(t, err)
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: map[string]any{"Address": "198.51.100.7"}}))
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: map[string]any{"Address": "198.51.100.8"}}))
	must(t, d.DiscoverDelete(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: map[string]any{"Address": "198.51.100.8"}}))
	cp := &recordingCP{}
	d.SetControlPlane(cp)
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if !slices.Equal(cp.added, []string{"n1"}) || !slices.Equal(cp.published, []string{"n1/e1"}) ||
		!slices.Equal(cp.hints, []netip.Addr{netip.MustParseAddr("198.51.100.7")}) {
		t.Fatalf("late control plane: added %v published %v hints %v", cp.added, cp.published, cp.hints)
	}
}

func TestFloodEntriesPerVTEP(t *testing.T) {
	d, k := newFake(t)
	req := createNetReq("n1", 300)
	req.Options[genericOptionsKey].(map[string]any)[OptFlood] = "true"
	must(t, d.CreateNetwork(req))
	createJoined(t, d, "e1", 1)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	must(t, d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.2")))
	must(t, d.AddPeer("n1", remotePeer("r3", "10.1.0.52", "02:00:00:00:00:52", "198.51.100.3")))
	flood := func(v string) kernel.FDBEntry { return kernel.FDBEntry{VTEP: netip.MustParseAddr(v)} }
	sb := k.Snapshot()["n1"]
	if !sb.FDB[flood("198.51.100.2")] || !sb.FDB[flood("198.51.100.3")] || len(sb.FDB) != 5 {
		t.Fatalf("flood entries missing: %v", sb.FDB)
	}
	must(t, d.DeletePeer("n1", "r1"))
	if !k.Snapshot()["n1"].FDB[flood("198.51.100.2")] {
		t.Fatal("flood entry removed while the VTEP still has an endpoint")
	}
	must(t, d.DeletePeer("n1", "r2"))
	if sb := k.Snapshot()["n1"]; sb.FDB[flood("198.51.100.2")] || len(sb.FDB) != 2 {
		t.Fatalf("flood entry kept after the VTEP's last endpoint: %v", sb.FDB)
	}
	// Without the option, no flood entries.
	d2, k2 := newFake(t)
	must(t, d2.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d2, "e1", 1)
	must(t, d2.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	if sb := k2.Snapshot()["n1"]; len(sb.FDB) != 1 {
		t.Fatalf("flood entries without the option: %v", sb.FDB)
	}
}
