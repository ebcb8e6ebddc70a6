package driver

import (
	"errors"
	"slices"
	"strings"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// A MAC held by a remote endpoint of the network is refused to a new local
// endpoint, with the conflict error a local duplicate gets, and nothing is
// stored; the same MAC on a remote endpoint that holds the new endpoint's
// address is the stale claim of an address swarm gave out again, which the
// local endpoint wins.
func TestCreateEndpointRefusesARemoteMAC(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	req := endpointReq("n1", "e1", 1)
	req.Interface.MacAddress = "02:00:00:00:00:50"
	_, err := d.CreateEndpoint(req)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "MAC 02:00:00:00:00:50 is held by remote endpoint r1 (on 198.51.100.2)") {
		t.Fatalf("a remote endpoint's MAC: %v, want a conflict naming it", err)
	}
	if st := d.State(); len(st[0].Endpoints) != 0 {
		t.Fatalf("a refused endpoint was stored: %+v", st[0].Endpoints)
	}

	// Swarm gave 10.1.0.12 out again; its old holder's retraction has not
	// come yet. The new endpoint's derived MAC equals the old one's.
	stale := endpointReq("n1", "e2", 2) // 10.1.0.12
	old := remotePeer("r2", "10.1.0.12", "02:42:0a:01:00:0c", "198.51.100.3")
	must(t, d.AddPeer("n1", old))
	resp, err := d.CreateEndpoint(stale)
	must(t, err)
	if resp.Interface.MacAddress != old.MAC.String() {
		t.Fatalf("derived MAC %s, want %s", resp.Interface.MacAddress, old.MAC)
	}
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e2", SandboxKey: "/x"})
	must(t, err)
	if sb := k.Snapshot()["n1"]; sb == nil {
		t.Fatal("no sandbox")
	}
}

// A remote endpoint whose MAC a local endpoint holds is refused and
// counted, never programmed over it; once the local endpoint goes, the
// control plane's record of it is added.
func TestRemoteMACOfALocalEndpointRefused(t *testing.T) {
	d, k := newFake(t)
	r := remotePeer("r1", "10.1.0.50", "02:42:0a:01:00:0b", "198.51.100.2") // e1's derived MAC
	cp := &recordingCP{snapshot: []peerdb.Peer{r}}
	d.SetControlPlane(cp)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1) // 10.1.0.11
	if fdbHas(k.Snapshot()["n1"].FDB, r) {
		t.Fatal("the sandbox was built with the remote endpoint over the local MAC")
	}
	err := d.AddPeer("n1", r)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "is held by local endpoint e1") {
		t.Fatalf("a remote endpoint with a local MAC: %v", err)
	}
	if n := d.MACConflicts(); n != 2 { // the sandbox's sync, then the delivery
		t.Fatalf("MAC conflicts counted: %d, want 2", n)
	}
	if fdbHas(k.Snapshot()["n1"].FDB, r) {
		t.Fatal("the remote endpoint was programmed over the local MAC")
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e1"}))
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "e1"}))
	if !slices.ContainsFunc(d.State()[0].Peers, func(p peerdb.Peer) bool { return p.EndpointID == "r1" && p.VTEP == r.VTEP }) {
		t.Fatalf("the refused remote endpoint is not added once the local one is gone: %+v", d.State()[0].Peers)
	}
}

// fdbHas: an entry sends p's MAC to p's VTEP.
func fdbHas(fdb map[kernel.FDBEntry]bool, p peerdb.Peer) bool {
	for e := range fdb {
		if e.MAC == p.MAC && e.VTEP == p.VTEP {
			return true
		}
	}
	return false
}
