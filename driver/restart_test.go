package driver

import (
	"fmt"
	"net/netip"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
)

// TestRestartResumes stops a driver with joined endpoints and starts a new
// one on the same state and kernel, as `docker plugin disable`/`enable`
// does: the sandboxes are adopted with their containers (the encrypted one
// guarded again with new keys, there being no IPsec state to take over),
// and so is a sandbox no record owns; Docker's later calls succeed.
func TestRestartResumes(t *testing.T) {
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	fe := newFakeEncryption()
	d.SetEncryption(fe)
	must(t, d.CreateNetwork(createNetReq("plain", 300)))
	must(t, d.CreateNetwork(encryptedReq("secret", 301)))
	must(t, d.CreateNetwork(createNetReq("idle", 302)))
	for _, n := range []string{"plain", "secret"} {
		_, err := d.CreateEndpoint(endpointReq(n, "e"+n, 1))
		must(t, err)
		_, err = d.Join(&api.JoinRequest{NetworkID: n, EndpointID: "e" + n})
		must(t, err)
	}
	_, err := d.CreateEndpoint(endpointReq("plain", "e2", 2)) // created, never joined
	must(t, err)
	stale := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	must(t, d.AddPeer("plain", stale))
	before := k.Snapshot()["plain"]
	d.Close()
	// A sandbox no stored network owns, as a crash might leave.
	k.AddLeftover(kernel.SandboxSpec{Name: "orphan", VNI: 999, Port: 4789, Local: localVTEP, MTU: 1450})

	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	d2.SetEncryption(fe)
	st := map[string]NetworkState{}
	for _, s := range d2.State() {
		st[s.ID] = s
	}
	if len(st) != 4 {
		t.Fatalf("restored %d networks, want 4", len(st))
	}
	plain := st["plain"]
	if plain.Sandbox != "plain" || plain.MTU != before.Spec.MTU || len(plain.Endpoints) != 2 || !plain.Endpoints[1].Joined {
		t.Fatalf("plain network not resumed: %+v", plain)
	}
	if s := st["secret"]; s.Sandbox != "secret" || !s.Endpoints[0].Joined {
		t.Fatalf("encrypted network not resumed: %+v", s)
	}
	// The first driver's guard stays with fe too: Close leaves the IPsec
	// state for the next run.
	if _, vnis := fe.snapshot(); vnis[301] != 2 {
		t.Fatalf("encrypted network not guarded again: %v", vnis)
	}
	if s := st["orphan"]; s.Sandbox != "orphan" || s.VNI != 999 {
		t.Fatalf("unknown sandbox not adopted: %+v", s)
	}
	snap := k.Snapshot()
	if snap["orphan"] == nil || snap["secret"] == nil || snap["plain"] == nil || len(snap["plain"].Veths) != 1 {
		t.Fatalf("kernel after restart: %v", snap)
	}
	// The peer that went while the plugin was down is never re-announced:
	// a resync removes it; one that is re-announced is kept.
	_, removed, err := d2.Resync()
	must(t, err)
	if removed != 2 || len(k.Snapshot()["plain"].Neighbors) != 0 {
		t.Fatalf("resync removed %d entries, kernel %v", removed, k.Snapshot()["plain"])
	}
	must(t, d2.AddPeer("plain", stale))
	if added, removed, err := d2.Resync(); err != nil || added+removed != 0 {
		t.Fatalf("resync of a consistent sandbox changed %d/%d entries: %v", added, removed, err)
	}
	// Docker's calls for the old containers succeed.
	for _, n := range []string{"plain", "secret"} {
		must(t, d2.Leave(&api.LeaveRequest{NetworkID: n, EndpointID: "e" + n}))
		must(t, d2.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: n, EndpointID: "e" + n}))
	}
	must(t, d2.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "plain", EndpointID: "e2"}))
	for _, n := range []string{"plain", "secret", "idle", "orphan"} {
		must(t, d2.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: n}))
	}
	if len(k.Snapshot()) != 0 {
		t.Fatalf("kernel not empty: %v", k.Snapshot())
	}
	// And nothing comes back after another restart.
	d3 := newTestDriverWith(t, k, localVTEP, db, false)
	if len(d3.State()) != 0 {
		t.Fatalf("deleted networks restored: %+v", d3.State())
	}
}

func TestResyncRepairsOutsideChanges(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	p := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	must(t, d.AddPeer("n1", p))
	// Someone deletes our entry and adds one of theirs.
	must(t, k.OutsideChange("n1", kerneltest.DeleteNeighbor(p.IPs[0]), kerneltest.SetNeighbor(netip.MustParseAddr("10.1.0.99"), p.MAC)))
	added, removed, err := d.Resync()
	must(t, err)
	sb := k.Snapshot()["n1"]
	if added != 1 || removed != 1 || len(sb.Neighbors) != 1 || sb.Neighbors[p.IPs[0]] != p.MAC {
		t.Fatalf("resync: +%d -%d, neighbours %v", added, removed, sb.Neighbors)
	}
}

// TestRestartResumesEncrypted: the encrypted network's sandbox is adopted
// but left alone (no IPsec calls, peers waiting) until the encryption side
// is connected; then the VNI is guarded again and the peers are
// programmed, whether the previous run's IPsec state was taken over or
// new keys replace it: its container keeps its interface.
func TestRestartResumesEncrypted(t *testing.T) {
	for _, resumed := range []bool{true, false} {
		t.Run(fmt.Sprintf("resumed=%v", resumed), func(t *testing.T) {
			db := testDB(t)
			k := fakekernel.New()
			d := newTestDriverWith(t, k, localVTEP, db, false)
			d.SetEncryption(newFakeEncryption())
			must(t, d.CreateNetwork(encryptedReq("secret", 301)))
			_, err := d.CreateEndpoint(endpointReq("secret", "e1", 1))
			must(t, err)
			_, err = d.Join(&api.JoinRequest{NetworkID: "secret", EndpointID: "e1"})
			must(t, err)
			d.Close()

			d2 := newTestDriverWith(t, k, localVTEP, db, true)
			if s := d2.State(); len(s) != 1 || s[0].Sandbox != "secret" || !s[0].Endpoints[0].Joined {
				t.Fatalf("encrypted sandbox not adopted: %+v", s)
			}
			// A peer learnt before encryption is connected waits.
			peer := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
			must(t, d2.AddPeer("secret", peer))
			if n := len(k.Snapshot()["secret"].FDB); n != 0 {
				t.Fatalf("peer programmed before its IPsec state could be: %d FDB entries", n)
			}
			fe := newFakeEncryption()
			fe.resumed = resumed
			d2.SetEncryption(fe)
			refs, vnis := fe.snapshot()
			sb := k.Snapshot()["secret"]
			st := d2.State()[0]
			if sb == nil || len(sb.FDB) != 1 || vnis[301] != 1 || refs[netip.MustParseAddr("198.51.100.2")] != 1 || !st.Endpoints[0].Joined {
				t.Fatalf("sandbox %+v, refs %v, vnis %v, state %+v", sb, refs, vnis, st)
			}
			must(t, d2.Leave(&api.LeaveRequest{NetworkID: "secret", EndpointID: "e1"}))
			if refs, vnis := fe.snapshot(); len(refs) != 0 || len(vnis) != 0 || k.Snapshot()["secret"] != nil {
				t.Fatalf("after Leave: refs %v vnis %v kernel %v", refs, vnis, k.Snapshot())
			}
		})
	}
}
