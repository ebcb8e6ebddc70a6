package driver

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func remotePeer(eid, ip, mac, vtep string) peerdb.Peer {
	m, err := hwaddr.Parse(mac)
	if err != nil {
		panic(err)
	}
	return peerdb.Peer{EndpointID: eid, IPs: []netip.Addr{netip.MustParseAddr(ip)}, MAC: m, VTEP: netip.MustParseAddr(vtep)}
}

func TestCapabilities(t *testing.T) {
	d, _ := newFake(t)
	c, err := d.GetCapabilities()
	must(t, err)
	if c.Scope != "global" || c.ConnectivityScope != "global" {
		t.Fatalf("capabilities = %+v", c)
	}
}

func TestAllocateNetwork(t *testing.T) {
	d, _ := newFake(t)
	resp, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n1", Options: map[string]string{"com.docker.network.foo": "bar"}})
	must(t, err)
	want := map[string]string{"com.docker.network.foo": "bar", OptVNI: "256"}
	if !reflect.DeepEqual(resp.Options, want) {
		t.Fatalf("options = %v, want %v", resp.Options, want)
	}
	// A new leader replays the returned options: same answer, no new VNI.
	again, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n1", Options: resp.Options})
	must(t, err)
	if !reflect.DeepEqual(again.Options, want) {
		t.Fatalf("replayed options = %v, want %v", again.Options, want)
	}
	// The user's choice is honoured, and its alias accepted.
	user, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n2", Options: map[string]string{optVNIAlias: "1000"}})
	must(t, err)
	if user.Options[OptVNI] != "1000" {
		t.Fatalf("user VNI not honoured: %v", user.Options)
	}
	for name, opts := range map[string]map[string]string{
		"conflict":     {OptVNI: "1000"},
		"zero":         {OptVNI: "0"},
		"docker range": {OptVNI: "4096"},
		"too big":      {OptVNI: "16777216"},
		"list":         {OptVNI: "300,301"},
		"not a number": {OptVNI: "x"},
		"unknown key":  {"vni": "300"},
		"bad mtu":      {OptMTU: "100"},
		"bad flood":    {OptFlood: "maybe"},
	} {
		if _, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n3", Options: opts}); err == nil {
			t.Errorf("%s: AllocateNetwork(%v) succeeded", name, opts)
		}
	}
	if _, ok := d.vnis.Lookup("n3"); ok {
		t.Fatal("a failed AllocateNetwork reserved a VNI")
	}
	must(t, d.FreeNetwork(&api.FreeNetworkRequest{NetworkID: "n2"}))
	if _, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n3", Options: map[string]string{OptVNI: "1000"}}); err != nil {
		t.Fatalf("VNI not released by FreeNetwork: %v", err)
	}
}

func TestCreateNetworkRejectsBadInput(t *testing.T) {
	d, _ := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	bad := map[string]*api.CreateNetworkRequest{
		"duplicate id":        createNetReq("n1", 301),
		"duplicate VNI":       createNetReq("n2", 300),
		"no VNI":              {NetworkID: "n3"},
		"VNI in Docker range": createNetReq("n6", 5000),
		"bad id":              createNetReq("../etc", 302),
		"empty id":            createNetReq("", 302),
		"generic type":        {NetworkID: "n4", Options: map[string]any{genericOptionsKey: "x"}},
		"generic values":      {NetworkID: "n4", Options: map[string]any{genericOptionsKey: map[string]any{OptVNI: 5}}},
		"bad pool":            {NetworkID: "n5", Options: createNetReq("", 303).Options, IPv4Data: []*api.IPAMData{{Pool: "nope"}}},
		"null pool":           {NetworkID: "n5", Options: createNetReq("", 303).Options, IPv4Data: []*api.IPAMData{nil}},
	}
	for name, req := range bad {
		if err := d.CreateNetwork(req); err == nil {
			t.Errorf("%s: CreateNetwork succeeded", name)
		}
	}
	if got := len(d.State()); got != 1 {
		t.Fatalf("%d networks after rejected creates, want 1", got)
	}
}

func TestUnknownIDs(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	errs := []error{
		d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "nx"}),
		d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "ex"}),
		d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "ex"}),
		d.AddPeer("nx", remotePeer("r1", "10.1.0.2", "02:00:00:00:00:02", "198.51.100.2")),
		d.DeletePeer("nx", "r1"),
	}
	_, err := d.Join(&api.JoinRequest{NetworkID: "nx", EndpointID: "e1"})
	errs = append(errs, err)
	_, err = d.CreateEndpoint(endpointReq("nx", "e1", 1))
	errs = append(errs, err)
	_, err = d.EndpointInfo(&api.InfoRequest{NetworkID: "n1", EndpointID: "e1"})
	errs = append(errs, err)
	for i, err := range errs {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("call %d: err = %v, want ErrNotFound", i, err)
		}
	}
	if len(k.Snapshot()) != 0 {
		t.Fatal("kernel touched by failed calls")
	}
}

func TestCreateEndpointValidation(t *testing.T) {
	d, _ := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	resp, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
	must(t, err)
	// Derived from the IPv4 address (10.1.0.11), so a reused address keeps it.
	if resp.Interface == nil || resp.Interface.MacAddress != "02:42:0a:01:00:0b" {
		t.Fatalf("assigned MAC %+v, want 02:42:0a:01:00:0b", resp.Interface)
	}
	v6only := &api.CreateEndpointRequest{NetworkID: "n1", EndpointID: "e6", Interface: &api.EndpointInterface{AddressIPv6: "fd00:1::1:2/64"}}
	resp, err = d.CreateEndpoint(v6only)
	must(t, err)
	if resp.Interface.MacAddress != "02:42:00:01:00:02" {
		t.Fatalf("IPv6-only MAC %s, want 02:42:00:01:00:02", resp.Interface.MacAddress)
	}
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "e6"}))
	given := endpointReq("n1", "e2", 2)
	given.Interface.MacAddress = "02:42:0a:01:00:0c"
	resp, err = d.CreateEndpoint(given)
	must(t, err)
	if resp.Interface != nil {
		t.Fatalf("response repeats Docker's MAC: %+v", resp.Interface)
	}
	bad := map[string]*api.CreateEndpointRequest{
		"duplicate":      endpointReq("n1", "e1", 3),
		"no interface":   {NetworkID: "n1", EndpointID: "e3"},
		"no address":     {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{}},
		"outside subnet": {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{Address: "192.168.9.9/24"}},
		"v6 in v4 field": {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{Address: "fd00:1::9/64"}},
		"no prefix":      {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{Address: "10.1.0.9"}},
		"bad MAC":        {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{Address: "10.1.0.9/16", MacAddress: "zz"}},
		"multicast MAC":  {NetworkID: "n1", EndpointID: "e3", Interface: &api.EndpointInterface{Address: "10.1.0.9/16", MacAddress: "01:00:5e:00:00:01"}},
	}
	for name, req := range bad {
		if _, err := d.CreateEndpoint(req); err == nil {
			t.Errorf("%s: CreateEndpoint succeeded", name)
		}
	}
	if got := len(d.State()[0].Endpoints); got != 2 {
		t.Fatalf("%d endpoints, want 2", got)
	}
}

func TestJoinBuildsSandboxAndLastLeaveRemovesIt(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
	must(t, err)
	_, err = d.CreateEndpoint(endpointReq("n1", "e2", 2))
	must(t, err)
	if len(k.Snapshot()) != 0 {
		t.Fatal("sandbox built before any Join")
	}
	j, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1", SandboxKey: "/x"})
	must(t, err)
	if j.InterfaceName.DstPrefix != "eth" || j.InterfaceName.SrcName == "" {
		t.Fatalf("join response %+v", j)
	}
	sb := k.Snapshot()["n1"]
	if sb == nil {
		t.Fatal("no sandbox after first Join")
	}
	wantSpec := kernel.SandboxSpec{Name: "n1", VNI: 300, Port: 4789, Local: localVTEP, MTU: 1450}
	if sb.Spec != wantSpec {
		t.Fatalf("sandbox spec %+v, want %+v", sb.Spec, wantSpec)
	}
	if len(sb.Veths) != 1 {
		t.Fatalf("veths %v", sb.Veths)
	}
	if _, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("second Join: %v", err)
	}
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e2"})
	must(t, err)
	if got := k.Calls(fakekernel.OpCreateSandbox); got != 1 {
		t.Fatalf("CreateSandbox called %d times", got)
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e1"}))
	if sb := k.Snapshot()["n1"]; sb == nil || len(sb.Veths) != 1 {
		t.Fatal("sandbox or veths wrong after first Leave")
	}
	if err := d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e1"}); err != nil {
		t.Fatalf("a repeated Leave: %v", err)
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e2"}))
	if len(k.Snapshot()) != 0 {
		t.Fatal("sandbox survives the last Leave")
	}
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "e1"}))
	must(t, d.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: "n1", EndpointID: "e2"}))
	must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}))
	if len(d.State()) != 0 {
		t.Fatal("network survives DeleteNetwork")
	}
}

func TestPeersProgrammedAndReplayed(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	// Arrives before any sandbox: stored, not programmed.
	p1 := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	p1.IPs = append(p1.IPs, netip.MustParseAddr("fd00:1::50"))
	must(t, d.AddPeer("n1", p1))
	createJoined(t, d, "e1", 1)
	sb := k.Snapshot()["n1"]
	if len(sb.Neighbors) != 2 || len(sb.FDB) != 1 {
		t.Fatalf("after replay: neighbours %v fdb %v", sb.Neighbors, sb.FDB)
	}
	if !sb.FDB[kernel.FDBEntry{MAC: p1.MAC, VTEP: p1.VTEP}] {
		t.Fatalf("fdb %v lacks %v", sb.FDB, p1)
	}
	p2 := remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", "198.51.100.2")
	must(t, d.AddPeer("n1", p2))
	sb = k.Snapshot()["n1"]
	if len(sb.Neighbors) != 3 || len(sb.FDB) != 2 {
		t.Fatalf("after add: neighbours %v fdb %v", sb.Neighbors, sb.FDB)
	}
	// One IP of r1 goes: the FDB entry stays for the other.
	p1.IPs = p1.IPs[:1]
	must(t, d.AddPeer("n1", p1))
	sb = k.Snapshot()["n1"]
	if len(sb.Neighbors) != 2 || len(sb.FDB) != 2 {
		t.Fatalf("after update: neighbours %v fdb %v", sb.Neighbors, sb.FDB)
	}
	must(t, d.DeletePeer("n1", "r1"))
	must(t, d.DeletePeer("n1", "r1")) // repeats are fine
	sb = k.Snapshot()["n1"]
	if len(sb.Neighbors) != 1 || len(sb.FDB) != 1 {
		t.Fatalf("after delete: neighbours %v fdb %v", sb.Neighbors, sb.FDB)
	}
	// Local endpoints cannot be fed as peers.
	if err := d.AddPeer("n1", remotePeer("e1", "10.1.0.11", "02:00:00:00:00:11", "198.51.100.2")); !errors.Is(err, ErrConflict) {
		t.Fatalf("AddPeer of a local endpoint: %v", err)
	}
	if err := d.AddPeer("n1", peerdb.Peer{EndpointID: "r9"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AddPeer of an invalid peer: %v", err)
	}
}

func TestDuplicateIPClaims(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1)) // 10.1.0.11
	must(t, err)
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
	must(t, err)
	ip := netip.MustParseAddr("10.1.0.60")
	b := remotePeer("rb", "10.1.0.60", "02:00:00:00:00:0b", "198.51.100.3")
	a := remotePeer("ra", "10.1.0.60", "02:00:00:00:00:0a", "198.51.100.2")
	must(t, d.AddPeer("n1", b))
	must(t, d.AddPeer("n1", a))
	sb := k.Snapshot()["n1"]
	if sb.Neighbors[ip] != a.MAC || len(sb.FDB) != 1 || !sb.FDB[kernel.FDBEntry{MAC: a.MAC, VTEP: a.VTEP}] {
		t.Fatalf("smallest id should own %s: neighbours %v fdb %v", ip, sb.Neighbors, sb.FDB)
	}
	must(t, d.DeletePeer("n1", "ra"))
	sb = k.Snapshot()["n1"]
	if sb.Neighbors[ip] != b.MAC || len(sb.FDB) != 1 || !sb.FDB[kernel.FDBEntry{MAC: b.MAC, VTEP: b.VTEP}] {
		t.Fatalf("other claimant not restored: neighbours %v fdb %v", sb.Neighbors, sb.FDB)
	}
	// A remote claim on a local endpoint's IP is not programmed.
	must(t, d.AddPeer("n1", remotePeer("r0", "10.1.0.11", "02:00:00:00:00:0c", "198.51.100.3")))
	if _, ok := k.Snapshot()["n1"].Neighbors[netip.MustParseAddr("10.1.0.11")]; ok {
		t.Fatal("remote claim on a local IP programmed")
	}
}

func TestLocalJoinDisplacesAndLeaveRestoresRemoteClaim(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	for i, eid := range []string{"e1", "e2"} {
		_, err := d.CreateEndpoint(endpointReq("n1", eid, i+1))
		must(t, err)
	}
	_, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
	must(t, err)
	stale := remotePeer("r0", "10.1.0.12", "02:00:00:00:00:0c", "198.51.100.3") // e2's address
	must(t, d.AddPeer("n1", stale))
	ip := netip.MustParseAddr("10.1.0.12")
	if _, ok := k.Snapshot()["n1"].Neighbors[ip]; !ok {
		t.Fatal("remote claim not programmed")
	}
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e2"})
	must(t, err)
	if sb := k.Snapshot()["n1"]; len(sb.Neighbors) != 0 || len(sb.FDB) != 0 {
		t.Fatalf("local join did not displace remote claim: %v %v", sb.Neighbors, sb.FDB)
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n1", EndpointID: "e2"}))
	if sb := k.Snapshot()["n1"]; sb.Neighbors[ip] != stale.MAC || len(sb.FDB) != 1 {
		t.Fatalf("remote claim not restored after leave: %v %v", sb.Neighbors, sb.FDB)
	}
}

func TestJoinFailuresLeaveNothing(t *testing.T) {
	for _, op := range []fakekernel.Op{fakekernel.OpCreateSandbox, fakekernel.OpAddVeth} {
		t.Run(string(op), func(t *testing.T) {
			d, k := newFake(t)
			must(t, d.CreateNetwork(createNetReq("n1", 300)))
			_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
			must(t, err)
			k.SetFault(func(o fakekernel.Op, _ string) error {
				if o == op {
					return errors.New("injected")
				}
				return nil
			})
			if _, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"}); err == nil {
				t.Fatal("Join succeeded despite fault")
			}
			if len(k.Snapshot()) != 0 {
				t.Fatalf("leftover sandbox: %v", k.Snapshot())
			}
			st := d.State()[0]
			if st.Sandbox != "" || st.Endpoints[0].Joined || len(st.Peers) != 0 {
				t.Fatalf("state after failed join: %+v", st)
			}
			k.SetFault(nil)
			_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
			must(t, err)
		})
	}
}

func TestDeleteNetworkKeepsNetworkWhenKernelFails(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	k.SetFault(func(o fakekernel.Op, _ string) error {
		if o == fakekernel.OpDeleteSandbox {
			return errors.New("injected")
		}
		return nil
	})
	if err := d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}); err == nil {
		t.Fatal("DeleteNetwork succeeded despite fault")
	}
	if len(d.State()) != 1 {
		t.Fatal("network forgotten although its sandbox is still there")
	}
	k.SetFault(nil)
	must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}))
	if len(k.Snapshot()) != 0 || len(d.State()) != 0 {
		t.Fatal("retried delete left state")
	}
}

func TestMTU(t *testing.T) {
	d, k := newFake(t)
	req := createNetReq("n1", 300)
	req.Options[genericOptionsKey].(map[string]any)[OptMTU] = "1400"
	must(t, d.CreateNetwork(req))
	createJoined(t, d, "e1", 1)
	if got := k.Snapshot()["n1"].Spec.MTU; got != 1400 {
		t.Fatalf("MTU %d, want the option's 1400", got)
	}
	// An IPv6 underlay costs 20 bytes more.
	k6 := fakekernel.New()
	d6 := newTestDriverAt(t, k6, netip.MustParseAddr("2001:db8::1"))
	must(t, d6.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d6, "e1", 1)
	if got := k6.Snapshot()["n1"].Spec.MTU; got != 1430 {
		t.Fatalf("MTU %d on an IPv6 underlay, want 1430", got)
	}
}

func TestStaticRoutesForOtherSubnets(t *testing.T) {
	d, _ := newFake(t)
	req := createNetReq("n1", 300)
	req.IPv4Data = append(req.IPv4Data, &api.IPAMData{Pool: "10.2.0.0/16"})
	must(t, d.CreateNetwork(req))
	_, err := d.CreateEndpoint(endpointReq("n1", "e1", 1))
	must(t, err)
	j, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
	must(t, err)
	if len(j.StaticRoutes) != 1 || j.StaticRoutes[0].Destination != "10.2.0.0/16" || j.StaticRoutes[0].RouteType != routeConnected {
		t.Fatalf("static routes %+v", j.StaticRoutes)
	}
}

func TestAdvertiseAddrFromDiscovery(t *testing.T) {
	k := fakekernel.New()
	d := newTestDriverAt(t, k, netip.Addr{})
	// Without Docker's word, the default route's address after the wait.
	a, err := d.AdvertiseAddr(context.Background(), time.Millisecond)
	if err != nil || a != localVTEP {
		t.Fatalf("AdvertiseAddr = %v, %v; want the default route's %v", a, err, localVTEP)
	}
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1,
		DiscoveryData: map[string]any{"Address": "198.51.100.9", "BindAddress": "0.0.0.0", "Self": true}}))
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1,
		DiscoveryData: map[string]any{"Address": "198.51.100.10", "Self": false}}))
	must(t, d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 2, DiscoveryData: "keys we never get"}))
	for _, bad := range []any{nil, "x", map[string]any{"Address": "nope", "Self": true}} {
		if err := d.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: 1, DiscoveryData: bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("DiscoverNew(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	a, err = d.AdvertiseAddr(context.Background(), time.Hour)
	if err != nil || a != netip.MustParseAddr("198.51.100.9") {
		t.Fatalf("AdvertiseAddr = %v, %v; want Docker's address for this node", a, err)
	}
	d.SetDataPath(a, 4789)
	d.SetDataPath(localVTEP, 4790) // settled: ignored
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	if got := k.Snapshot()["n1"].Spec.Local; got != a {
		t.Fatalf("sandbox VTEP %v, want %v", got, a)
	}
}

// TestLeftoversRemovedAtStart: a sandbox is a provable leftover when its
// network's record says it has none and no container is attached.
func TestLeftoversRemovedAtStart(t *testing.T) {
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	must(t, d.CreateNetwork(createNetReq("old", 300)))
	d.Close()
	k.AddLeftover(kernel.SandboxSpec{Name: "old", VNI: 300, MTU: 1450})
	newTestDriverWith(t, k, localVTEP, db, false)
	if len(k.Snapshot()) != 0 {
		t.Fatal("leftover sandbox survived start")
	}
}

// TestCloseKeepsSandboxes: a stop keeps every sandbox, encrypted ones
// included, and leaves the encryption side alone (its Detach keeps the
// kernel's IPsec state for the next run).
func TestCloseKeepsSandboxes(t *testing.T) {
	fe := newFakeEncryption()
	d, k := newEncryptedDriver(t, fe)
	must(t, d.CreateNetwork(createNetReq("plain", 300)))
	must(t, d.CreateNetwork(encryptedReq("secret", 301)))
	for _, n := range []string{"plain", "secret"} {
		_, err := d.CreateEndpoint(endpointReq(n, "e"+n, 1))
		must(t, err)
		_, err = d.Join(&api.JoinRequest{NetworkID: n, EndpointID: "e" + n})
		must(t, err)
	}
	must(t, d.AddPeer("secret", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	d.Close()
	snap := k.Snapshot()
	if snap["plain"] == nil || snap["secret"] == nil || len(d.State()) != 0 {
		t.Fatalf("after Close: sandboxes %v, networks %d", snap, len(d.State()))
	}
	if refs, vnis := fe.snapshot(); len(refs) != 1 || vnis[301] != 1 {
		t.Fatalf("Close released IPsec references: %v %v", refs, vnis)
	}
}

// A remote peer whose id DeletePeer would refuse cannot be added either:
// with id "0-forged" it took over another endpoint's IP (the smallest id
// wins) and no retraction could remove it.
func TestAddPeerRefusesIdsDeleteRefuses(t *testing.T) {
	d, _ := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	real := remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")
	must(t, d.AddPeer("n1", real))
	for _, id := range []string{"0-forged", "a/b", "", strings.Repeat("a", 129)} {
		forged := remotePeer(id, "10.1.0.50", "02:00:00:00:00:66", "198.51.100.9")
		if err := d.AddPeer("n1", forged); !errors.Is(err, ErrInvalid) {
			t.Errorf("AddPeer with id %q = %v, want ErrInvalid", id, err)
		}
		if err := d.DeletePeer("n1", id); !errors.Is(err, ErrInvalid) {
			t.Errorf("DeletePeer with id %q = %v, want ErrInvalid (the same rule)", id, err)
		}
	}
	st := d.State()[0]
	if len(st.Peers) != 1 || st.Peers[0].EndpointID != "r1" {
		t.Fatalf("peers after the forged adds: %+v, want r1 alone", st.Peers)
	}
}

// TestPortSettledLater: a first run that does not know its VXLAN port yet
// (the control plane learns it from the members) builds no sandbox until
// SetDataPath names it, even with its address known; then the sandbox
// uses it.
func TestPortSettledLater(t *testing.T) {
	k := fakekernel.New()
	cfg := testConfig(t, k, testDB(t))
	cfg.VXLANPort = 0
	d := newFromConfig(t, cfg)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	joined := make(chan error, 1)
	go func() {
		if _, err := d.CreateEndpoint(endpointReq("n1", "e1", 1)); err != nil {
			joined <- err
			return
		}
		_, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "e1"})
		joined <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if sb, _ := k.Sandboxes(); len(sb) != 0 {
		t.Fatalf("sandboxes before the port is settled: %v", sb)
	}
	d.SetDataPath(localVTEP, 5789)
	must(t, <-joined)
	if got := k.Snapshot()["n1"].Spec.Port; got != 5789 {
		t.Errorf("the VXLAN device on port %d, want 5789", got)
	}
}
