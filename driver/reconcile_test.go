package driver

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// running starts d.Run and stops it at the test's end.
func running(t *testing.T, d *Driver) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// checkHealthy fails t unless every sandbox's devices are intact.
func checkHealthy(t *testing.T, k *fakekernel.Kernel) {
	t.Helper()
	for name, sb := range k.Snapshot() {
		if len(sb.Broken) != 0 {
			t.Errorf("sandbox %s: devices still broken: %v", name, sb.Broken)
		}
	}
}

var errInjected = errors.New("injected fault")

// TestFaultMatrix fails every kernel call, reads and dumps included, during
// each step of a network's life (sandbox build, joins, peer adds and
// deletes, outside drift, leaves, sandbox removal) and requires the kernel
// to equal what the driver's state implies one second after the fault
// clears, and again at the end.
func TestFaultMatrix(t *testing.T) {
	p1 := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	p2 := remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.3")
	p3 := remotePeer("r3", "10.1.0.52", "02:00:00:00:00:52", "198.51.100.2")
	p4 := remotePeer("r4", "10.1.0.53", "02:00:00:00:00:53", "198.51.100.4")
	type step struct {
		name string
		do   func(d *Driver, k *fakekernel.Kernel) error
	}
	join := func(eid string) func(*Driver, *fakekernel.Kernel) error {
		return func(d *Driver, _ *fakekernel.Kernel) error {
			_, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: eid})
			return err
		}
	}
	leave := func(eid string) func(*Driver, *fakekernel.Kernel) error {
		return func(d *Driver, _ *fakekernel.Kernel) error {
			return d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: eid})
		}
	}
	addPeer := func(p1 peerdb.Peer) func(*Driver, *fakekernel.Kernel) error {
		return func(d *Driver, _ *fakekernel.Kernel) error { return d.AddPeer("n1", p1) }
	}
	steps := []step{
		{"add peer before any sandbox", addPeer(p4)},
		{"join first, building the sandbox and programming the peer", join("e1")},
		{"join second", join("e2")},
		{"add peer", addPeer(p1)},
		{"add peer on another VTEP", addPeer(p2)},
		{"add peer on a known VTEP", addPeer(p3)},
		{"delete peer", func(d *Driver, _ *fakekernel.Kernel) error { return d.DeletePeer("n1", "r1") }},
		{"vxlan0 deleted from outside", func(_ *Driver, k *fakekernel.Kernel) error { return k.BreakDevice("n1", kernel.VXLANName) }},
		{"bridge deleted from outside", func(_ *Driver, k *fakekernel.Kernel) error { return k.BreakDevice("n1", kernel.BridgeName) }},
		{"leave", leave("e2")},
		{"join again after a leave", join("e2")},
		{"leave", leave("e2")},
		{"leave last, removing the sandbox", leave("e1")},
	}
	for at, faulty := range steps {
		for _, op := range fakekernel.Ops {
			t.Run(fmt.Sprintf("%02d %s/%s fails", at, faulty.name, op), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					k := fakekernel.New()
					d := newTestDriver(t, k)
					running(t, d)
					req := createNetReq("n1", 300)
					req.Options[genericOptionsKey].(map[string]any)[OptFlood] = ""
					must(t, d.CreateNetwork(req))
					for i, e := range []string{"e1", "e2"} {
						_, err := d.CreateEndpoint(endpointReq("n1", e, i))
						must(t, err)
					}
					var failed sync.Map // the fault is on while the step runs
					for i, s := range steps {
						if i == at {
							k.SetFault(func(o fakekernel.Op, _ string) error {
								if o == op {
									failed.Store(o, true)
									return errInjected
								}
								return nil
							})
						}
						err := s.do(d, k)
						if i != at {
							if err != nil && !errors.Is(err, ErrNotFound) {
								t.Logf("step %q: %v", s.name, err)
							}
							continue
						}
						synctest.Wait() // what the step set off, under the fault too
						k.SetFault(nil)
						time.Sleep(time.Second)
						synctest.Wait()
						checkInvariants(t, d, k)
						checkHealthy(t, k)
						if t.Failed() {
							t.Fatalf("1 s after the fault in step %q cleared (step error: %v)", s.name, err)
						}
					}
					time.Sleep(time.Second)
					synctest.Wait()
					checkInvariants(t, d, k)
					checkHealthy(t, k)
				})
			})
		}
	}
}

// TestDriftRepairedOnEvents: entries deleted, changed and added from
// outside, and a deleted bridge and VXLAN device, are repaired on the
// kernel's events well within a second (the periodic pass is an hour
// away), and every repair is counted by kind.
func TestDriftRepairedOnEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := fakekernel.New()
		d := newTestDriver(t, k)
		d.resyncPeriod = time.Hour
		running(t, d)
		must(t, d.CreateNetwork(createNetReq("n1", 300)))
		createJoined(t, d, "e1", 1)
		p := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
		must(t, d.AddPeer("n1", p))
		synctest.Wait()
		if r := d.Repairs(); r[RepairNeighborAdded]+r[RepairFDBAdded] != 0 {
			t.Fatalf("our own programming counted as repairs: %v", r)
		}
		stranger := kernel.FDBEntry{MAC: p.MAC, VTEP: netip.MustParseAddr("198.51.100.9")}
		for _, drift := range []struct {
			name string
			do   func() error
			kind string
		}{
			{"neighbour deleted", func() error { return k.OutsideChange("n1", kerneltest.DeleteNeighbor(p.IPs[0])) }, RepairNeighborAdded},
			{"neighbour changed", func() error {
				return k.OutsideChange("n1", kerneltest.SetNeighbor(p.IPs[0], hwaddrMust("02:00:00:00:00:99")))
			}, RepairNeighborReplaced},
			{"neighbour added", func() error {
				return k.OutsideChange("n1", kerneltest.SetNeighbor(netip.MustParseAddr("10.1.0.99"), p.MAC))
			}, RepairNeighborRemoved},
			{"FDB entry deleted", func() error { return k.OutsideChange("n1", kerneltest.DeleteFDB(p.MAC, p.VTEP)) }, RepairFDBAdded},
			{"FDB entry pointed elsewhere", func() error { return k.OutsideChange("n1", kerneltest.AddFDB(stranger.MAC, stranger.VTEP)) }, RepairFDBReplaced},
			{"FDB entry added", func() error {
				return k.OutsideChange("n1", kerneltest.AddFDB(hwaddrMust("02:00:00:00:00:77"), p.VTEP))
			}, RepairFDBRemoved},
			{"vxlan0 deleted", func() error { return k.BreakDevice("n1", kernel.VXLANName) }, RepairDeviceRebuilt},
			{"bridge deleted", func() error { return k.BreakDevice("n1", kernel.BridgeName) }, RepairDeviceFixed},
		} {
			before := d.Repairs()[drift.kind]
			start := time.Now()
			must(t, drift.do())
			time.Sleep(200 * time.Millisecond) // a pass is due within minGap
			synctest.Wait()
			checkInvariants(t, d, k)
			checkHealthy(t, k)
			if got := d.Repairs()[drift.kind]; got <= before {
				t.Errorf("%s: %s count %d, was %d", drift.name, drift.kind, got, before)
			}
			if t.Failed() {
				t.Fatalf("%s: not repaired %v later", drift.name, time.Since(start))
			}
		}
	})
}

// TestNewSandboxFillIsNotARepair: the peers a host learned before its
// first Join of a network are programmed when that Join builds the
// sandbox; that is the sandbox's first programming, and counting or
// logging it as the kernel having drifted would make every first Join a
// false alarm.
func TestNewSandboxFillIsNotARepair(t *testing.T) {
	k := fakekernel.New()
	d := newTestDriver(t, k)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	must(t, d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.3")))
	createJoined(t, d, "e1", 1)
	checkInvariants(t, d, k)
	if sb := k.Snapshot()["n1"]; len(sb.Neighbors) != 2 || len(sb.FDB) != 2 {
		t.Fatalf("new sandbox holds %d neighbours and %d FDB entries, want 2 and 2", len(sb.Neighbors), len(sb.FDB))
	}
	for kind, c := range d.Repairs() {
		if c != 0 {
			t.Errorf("the new sandbox's first programming counted as %d %s repairs", c, kind)
		}
	}
}

// TestRestartRepairsMissingVXLAN: a sandbox whose vxlan0 was deleted while
// the plugin was down is adopted and rebuilt before the driver serves,
// with its container's veth, not removed.
func TestRestartRepairsMissingVXLAN(t *testing.T) {
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	d.Close()
	must(t, k.BreakDevice("n1", kernel.VXLANName))

	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	sb := k.Snapshot()["n1"]
	if sb == nil || len(sb.Veths) != 1 || len(sb.Broken) != 0 {
		t.Fatalf("sandbox after restart: %+v", sb)
	}
	if st := d2.State(); len(st) != 1 || st[0].Sandbox != "n1" || !st[0].Endpoints[0].Joined || st[0].Kernel.Error != "" {
		t.Fatalf("state after restart: %+v", st)
	}
	if r := d2.Repairs(); r[RepairDeviceRebuilt] != 1 {
		t.Fatalf("repairs %v, want one device rebuilt", r)
	}
}

// TestJoinRepairsSandboxFirst: a Join into a sandbox whose devices were
// deleted rebuilds them (and refills the VXLAN device) before adding the
// veth; if they cannot be rebuilt, it fails saying so, and state shows it.
func TestJoinRepairsSandboxFirst(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	for i, e := range []string{"e1", "e2", "e3"} {
		_, err := d.CreateEndpoint(endpointReq("n1", e, i))
		must(t, err)
	}
	_, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
	must(t, err)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	must(t, k.BreakDevice("n1", kernel.BridgeName))
	must(t, k.BreakDevice("n1", kernel.VXLANName))
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e2"})
	must(t, err)
	checkInvariants(t, d, k)
	checkHealthy(t, k)

	must(t, k.BreakDevice("n1", kernel.VXLANName))
	k.SetFault(func(op fakekernel.Op, _ string) error {
		if op == fakekernel.OpRepairSandbox {
			return errInjected
		}
		return nil
	})
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e3"})
	if err == nil || !errors.Is(err, errInjected) {
		t.Fatalf("Join into a sandbox that cannot be repaired: %v", err)
	}
	if st := d.State()[0]; st.Kernel.Error == "" {
		t.Fatalf("state shows no error for a sandbox without %s: %+v", kernel.VXLANName, st.Kernel)
	}
}

// TestAdoptedSandboxKeepsEntriesUntilPeersSettle: after a restart the
// stale entries of an adopted sandbox stay until the control plane had
// time to deliver the peers again, then go; a re-delivered one stays. A
// control plane that reaches no other host delivers nothing: the entries
// stay however long that lasts (up to the periodic pass), or the restart
// would cut the containers' traffic.
func TestAdoptedSandboxKeepsEntriesUntilPeersSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d2, k, stays, goes := restartedWithTwoPeers(t)
		synctest.Wait()
		if n := len(k.Snapshot()["n1"].Neighbors); n != 2 {
			t.Fatalf("%d neighbours right after the restart, want both kept", n)
		}
		cp := &recordingCP{alone: true, connect: make(chan struct{})}
		cp.setLive(stays.VTEP, goes.VTEP) // r2's host is back; r2 is not
		d2.SetControlPlane(cp)
		time.Sleep(10 * peerSettle)
		synctest.Wait()
		if n := len(k.Snapshot()["n1"].Neighbors); n != 2 {
			t.Fatalf("%d neighbours while no other host is reachable, want both kept", n)
		}
		close(cp.connect)
		must(t, d2.AddPeer("n1", stays)) // re-delivered
		time.Sleep(peerSettle + 200*time.Millisecond)
		synctest.Wait()
		checkInvariants(t, d2, k)
		if sb := k.Snapshot()["n1"]; len(sb.Neighbors) != 1 || sb.Neighbors[stays.IPs[0]] != stays.MAC {
			t.Fatalf("after the peers settled: %v", sb.Neighbors)
		}
	})
}

// A host that went away before it could deliver its endpoints to the
// restarted plugin (its plugin stopped too, as in a rolling disable/enable)
// keeps its entries in the adopted sandbox for the dead grace since the
// start, as long as every other host keeps its endpoints: its containers'
// traffic with this host's goes on. Then they go like any stale entry.
func TestAdoptedSandboxKeepsEntriesOfHostsNotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d2, k, back, _ := restartedWithTwoPeers(t)
		cp := &recordingCP{}
		cp.setLive(back.VTEP)
		d2.SetControlPlane(cp)
		must(t, d2.AddPeer("n1", back)) // re-delivered; away's host is not back
		time.Sleep(5 * peerSettle)
		synctest.Wait()
		if sb := k.Snapshot()["n1"]; len(sb.Neighbors) != 2 || len(sb.FDB) != 2 {
			t.Fatalf("after the peers settled, with r2's host away: %v %v, want both hosts' entries kept", sb.Neighbors, sb.FDB)
		}
		time.Sleep(DefaultResyncPeriod)
		synctest.Wait()
		checkInvariants(t, d2, k)
		if sb := k.Snapshot()["n1"]; len(sb.Neighbors) != 1 || sb.Neighbors[back.IPs[0]] != back.MAC || len(sb.FDB) != 1 {
			t.Fatalf("after the dead grace: %v %v, want only r1's", sb.Neighbors, sb.FDB)
		}
	})
}

// restartedWithTwoPeers is a network with a joined endpoint and two
// remote peers on two hosts, and a driver started again on its state and
// kernel (running), so that its sandbox is adopted.
func restartedWithTwoPeers(t *testing.T) (*Driver, *fakekernel.Kernel, peerdb.Peer, peerdb.Peer) {
	t.Helper()
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	p1 := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	p2 := remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.3")
	must(t, d.AddPeer("n1", p1))
	must(t, d.AddPeer("n1", p2))
	d.Close()
	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	running(t, d2)
	return d2, k, p1, p2
}

func hwaddrMust(s string) hwaddr.MAC {
	m, err := hwaddr.Parse(s)
	if err != nil {
		panic(err)
	}
	return m
}
