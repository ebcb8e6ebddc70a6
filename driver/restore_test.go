package driver

import (
	"bytes"
	"errors"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// runningContainer plants a container's veth in a sandbox, moved out of
// the host namespace as Docker does, and returns its sandbox end's name.
func runningContainer(t *testing.T, k *fakekernel.Kernel, sandbox, eid string) string {
	t.Helper()
	v := vethFor(eid, hwaddr.MAC{0x02, 0x42, 1, 2, 3, byte(len(eid))}, 1450)
	must(t, k.AddVeth(sandbox, v))
	k.MoveToContainer(v.HostName)
	return v.SandboxName
}

// TestUnknownSandboxAdopted: with the state lost, a running sandbox is
// adopted from the kernel, not removed; Docker's calls for the containers
// the plugin cannot know succeed, the last Leave removes the sandbox, and
// Docker creating the network again merges with it.
func TestUnknownSandboxAdopted(t *testing.T) {
	k := fakekernel.New()
	k.AddLeftover(kernel.SandboxSpec{Name: "lost", VNI: 400, Port: 4789, Local: localVTEP, MTU: 1450})
	c1 := runningContainer(t, k, "lost", "c1c1c1c1c1c1c1")
	runningContainer(t, k, "lost", "c2c2c2c2c2c2c2")
	d := newTestDriver(t, k)
	st := d.State()
	if len(st) != 1 || st[0].ID != "lost" || st[0].VNI != 400 || st[0].Sandbox != "lost" || st[0].MTU != 1450 {
		t.Fatalf("state after start: %+v", st)
	}
	if sb := k.Snapshot()["lost"]; sb == nil || len(sb.Veths) != 2 {
		t.Fatalf("adopted sandbox changed: %+v", sb)
	}
	// A container started meanwhile: Docker knows the network, the plugin
	// does not know its subnets.
	_, err := d.CreateEndpoint(endpointReq("lost", "new1", 1))
	must(t, err)
	_, err = d.Join(&api.JoinRequest{NetworkID: "lost", EndpointID: "new1"})
	must(t, err)
	// Docker creates the network again: same VNI merges, another is refused.
	if err := d.CreateNetwork(createNetReq("lost", 401)); !errors.Is(err, ErrConflict) {
		t.Fatalf("CreateNetwork with another VNI: %v", err)
	}
	must(t, d.CreateNetwork(createNetReq("lost", 400)))
	if st := d.State(); len(st[0].Subnets) != 2 || st[0].Sandbox != "lost" {
		t.Fatalf("after the merge: %+v", st)
	}
	// The old containers go.
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "lost", EndpointID: "c1c1c1c1c1c1c1"}))
	if _, ok := k.Snapshot()["lost"].Veths[c1]; ok {
		t.Fatal("the left container's veth stayed")
	}
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "lost", EndpointID: "c1c1c1c1c1c1c1"}))
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "lost", EndpointID: "c2c2c2c2c2c2c2"}))
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "lost", EndpointID: "c2c2c2c2c2c2c2"}))
	if k.Snapshot()["lost"] == nil {
		t.Fatal("sandbox removed while a container is joined")
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "lost", EndpointID: "new1"}))
	if k.Snapshot()["lost"] != nil {
		t.Fatal("the last Leave left the sandbox")
	}
	// An endpoint the plugin never saw: nothing to do.
	if err := d.Leave(&api.LeaveRequest{NetworkID: "lost", EndpointID: "c9c9"}); err != nil {
		t.Fatalf("Leave of an unknown endpoint in a partial network: %v", err)
	}
}

// TestUnreadableRecordKeepsSandbox: a network record that does not decode,
// or has fields this build does not know, is left as it is and not used;
// the network's running sandbox is adopted with its joined endpoint.
func TestUnreadableRecordKeepsSandbox(t *testing.T) {
	for name, record := range map[string][]byte{
		"garbage":       []byte("{\"id\":"),
		"unknown field": []byte(`{"id":"n1","vni":300,"subnets":["10.1.0.0/16"],"sandboxMTU":1450,"future":true}`),
		"trailing":      []byte(`{"id":"n1","vni":300,"subnets":["10.1.0.0/16"]} {}`),
	} {
		t.Run(name, func(t *testing.T) {
			db := testDB(t)
			k := fakekernel.New()
			d := newTestDriverWith(t, k, localVTEP, db, false)
			must(t, d.CreateNetwork(createNetReq("n1", 300)))
			_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
			must(t, err)
			join, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
			must(t, err)
			k.MoveToContainer(join.InterfaceName.SrcName)
			d.Close()
			must(t, db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketNetworks).Put([]byte("n1"), record) }))

			d2 := newTestDriverWith(t, k, localVTEP, db, false)
			st := d2.State()
			if len(st) != 1 || st[0].Sandbox != "n1" || st[0].VNI != 300 || len(st[0].Endpoints) != 1 || !st[0].Endpoints[0].Joined {
				t.Fatalf("state: %+v", st)
			}
			if sb := k.Snapshot()["n1"]; sb == nil || len(sb.Veths) != 1 {
				t.Fatalf("sandbox: %+v", sb)
			}
			var kept []byte
			must(t, db.View(func(tx *bbolt.Tx) error {
				kept = bytes.Clone(tx.Bucket(bucketNetworks).Get([]byte("n1")))
				return nil
			}))
			if !bytes.Equal(kept, record) {
				t.Fatalf("the unreadable record was replaced by %s", kept)
			}
		})
	}
}

// TestAttachedContainerOutweighsRecord: a record that says no endpoint is
// joined does not make a sandbox with a container attached a leftover.
func TestAttachedContainerOutweighsRecord(t *testing.T) {
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
	must(t, err)
	d.Close()
	// A join whose record never made it to disk.
	k.AddLeftover(kernel.SandboxSpec{Name: "n1", VNI: 300, Port: 4789, Local: localVTEP, MTU: 1450})
	runningContainer(t, k, "n1", "e1")
	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	st := d2.State()
	if len(st) != 1 || st[0].Sandbox != "n1" || st[0].MTU != 1450 || !st[0].Endpoints[0].Joined {
		t.Fatalf("state: %+v", st)
	}
	must(t, d2.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e1"}))
	if k.Snapshot()["n1"] != nil {
		t.Fatal("sandbox stayed after the last Leave")
	}
}

// TestAdoptedPresumedEncrypted: a sandbox adopted without a record is
// programmed by nobody until the encryption side says whether the previous
// run guarded its VNI: nothing goes out in clear on a guess.
func TestAdoptedPresumedEncrypted(t *testing.T) {
	for _, guarded := range []bool{true, false} {
		k := fakekernel.New()
		k.AddLeftover(kernel.SandboxSpec{Name: "lost", VNI: 400, Port: 4789, Local: localVTEP, MTU: 1400})
		runningContainer(t, k, "lost", "c1c1c1c1c1c1c1")
		d := newTestDriverWith(t, k, localVTEP, testDB(t), true)
		must(t, d.AddPeer("lost", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
		if n := len(k.Snapshot()["lost"].FDB); n != 0 {
			t.Fatalf("peer programmed before encryption was settled: %d FDB entries", n)
		}
		fe := newFakeEncryption()
		if guarded {
			fe.inherited = []uint32{400}
		}
		d.SetEncryption(fe)
		refs, vnis := fe.snapshot()
		if len(k.Snapshot()["lost"].FDB) != 1 || (vnis[400] == 1) != guarded || (len(refs) == 1) != guarded {
			t.Fatalf("guarded=%v: FDB %v, refs %v, vnis %v", guarded, k.Snapshot()["lost"].FDB, refs, vnis)
		}
	}
}

// TestAdoptedVNINotHandedOut: the VNI of a sandbox adopted with the state
// lost is recorded in the VNI table before anything is allocated.
func TestAdoptedVNINotHandedOut(t *testing.T) {
	k := fakekernel.New()
	k.AddLeftover(kernel.SandboxSpec{Name: "lost", VNI: 256, Port: 4789, Local: localVTEP, MTU: 1450})
	runningContainer(t, k, "lost", "c1c1c1c1c1c1c1")
	d := newTestDriver(t, k)
	resp, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "fresh"})
	must(t, err)
	if resp.Options[OptVNI] == "256" {
		t.Fatal("the adopted network's VNI was handed out again")
	}
	if _, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "other", Options: map[string]string{OptVNI: "256"}}); err == nil {
		t.Fatal("the adopted network's VNI was reserved for another network")
	}
	// A new leader re-allocating the adopted network keeps its VNI.
	resp, err = d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "lost", Options: map[string]string{OptVNI: "256"}})
	must(t, err)
	if resp.Options[OptVNI] != "256" {
		t.Fatalf("re-allocated with %v", resp.Options)
	}
}
