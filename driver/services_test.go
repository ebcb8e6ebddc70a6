package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/servicelb/fakelb"
)

// newLBDriver is a driver with a fake kernel and a fake load balancer.
func newLBDriver(t *testing.T) (*Driver, *fakelb.LB) {
	t.Helper()
	lb := fakelb.New()
	return newLBDriverWith(t, fakekernel.New(), testDB(t), lb), lb
}

// newLBDriverWith builds it on k, db and lb, as a (re)started plugin does.
func newLBDriverWith(t *testing.T, k *fakekernel.Kernel, db *bbolt.DB, lb *fakelb.LB) *Driver {
	t.Helper()
	cfg := testConfig(t, k, db)
	cfg.LoadBalancer, cfg.SandboxDir = lb, "/docker-netns"
	return newFromConfig(t, cfg)
}

func joinAt(t *testing.T, d *Driver, nid, eid string, i int, key string) {
	t.Helper()
	if _, err := d.CreateEndpoint(endpointReq(nid, eid, i)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Join(&api.JoinRequest{NetworkID: nid, EndpointID: eid, SandboxKey: key}); err != nil {
		t.Fatal(err)
	}
}

// dualPeer is a remote endpoint addressed as endpointReq's i-th.
func dualPeer(eid string, i int) peerdb.Peer {
	return peerdb.Peer{EndpointID: eid, MAC: hwaddr.MAC{0x02, 0x42, 10, 1, 0, byte(10 + i)},
		IPs:  []netip.Addr{netip.AddrFrom4([4]byte{10, 1, 0, byte(10 + i)}), netip.MustParseAddr(fmt.Sprintf("fd00:1::%x", 10+i))},
		VTEP: netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)})}
}

func backendsOf(t *testing.T, lb *fakelb.LB, ns string) map[string][]netip.Addr {
	t.Helper()
	svcs, _ := lb.Services(ns)
	out := map[string][]netip.Addr{}
	for _, s := range svcs {
		out[s.Name+"@"+s.VIP.String()] = s.Backends
	}
	return out
}

var (
	vip4 = netip.MustParseAddr("10.1.0.2")
	vip6 = netip.MustParseAddr("fd00:1::2")
)

// The backends a container balances are the services' tasks whose
// endpoints the peer db holds, at their address of the VIP's family; they
// follow the peers and Docker's table, with churn, and a task that left is
// dropped before Docker's table says so.
func TestServicesFollowPeersAndTable(t *testing.T) {
	d, lb := newLBDriver(t)
	if err := d.CreateNetwork(createNetReq("n1", 300)); err != nil {
		t.Fatal(err)
	}
	joinAt(t, d, "n1", "client", 1, "/var/run/docker/netns/abc")
	ns := "/docker-netns/abc" // SandboxDir + the key's base name
	if err := d.AddPeer("n1", dualPeer("r1", 2)); err != nil {
		t.Fatal(err)
	}
	// r2 is listed by Docker before the control plane delivers it.
	svcs := []Service{
		{Name: "web", VIP: vip4, Endpoints: []string{"r1", "r2"}},
		{Name: "web6", VIP: vip6, Endpoints: []string{"r1", "client"}},
		{Name: "none", VIP: netip.MustParseAddr("10.1.0.3")},
	}
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	r1 := dualPeer("r1", 2).IPs[0]
	got := backendsOf(t, lb, ns)
	if len(got["web@10.1.0.2"]) != 1 || got["web@10.1.0.2"][0] != r1 {
		t.Fatalf("web balances %v, want only r1 %v (r2 not delivered yet)", got["web@10.1.0.2"], r1)
	}
	if len(got["web6@fd00:1::2"]) != 2 || !got["web6@fd00:1::2"][0].Is6() {
		t.Fatalf("web6 balances %v, want the v6 addresses of r1 and the local client", got["web6@fd00:1::2"])
	}
	if b, ok := got["none@10.1.0.3"]; !ok || len(b) != 0 {
		t.Fatalf("a service without tasks: %v, %v; want its VIP with no backend (refused)", b, ok)
	}

	// r2 arrives: it is balanced at once.
	if err := d.AddPeer("n1", dualPeer("r2", 3)); err != nil {
		t.Fatal(err)
	}
	if b := backendsOf(t, lb, ns)["web@10.1.0.2"]; len(b) != 2 {
		t.Fatalf("after r2 arrived web balances %v, want r1 and r2", b)
	}
	// r1 leaves: dropped at once, though Docker still lists it.
	if err := d.DeletePeer("n1", "r1"); err != nil {
		t.Fatal(err)
	}
	if b := backendsOf(t, lb, ns)["web@10.1.0.2"]; len(b) != 1 || b[0] != dualPeer("r2", 3).IPs[0] {
		t.Fatalf("after r1 left web balances %v, want r2 alone", b)
	}
	// A peer change of an endpoint no service has does not reprogram.
	applies := lb.Calls(fakelb.OpApply)
	if err := d.AddPeer("n1", dualPeer("other", 9)); err != nil {
		t.Fatal(err)
	}
	if n := lb.Calls(fakelb.OpApply); n != applies {
		t.Errorf("an unrelated peer reprogrammed the containers (%d applies)", n-applies)
	}
	// The same table again is no work.
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	if n := lb.Calls(fakelb.OpApply); n != applies {
		t.Errorf("an unchanged table reprogrammed the containers (%d applies)", n-applies)
	}
	// The services go: no table is left.
	if err := d.SetServices("n1", nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := lb.Services(ns); ok {
		t.Error("the container kept a table after every service went")
	}
}

// A container that joins later gets the current services; a failed
// programming is retried by the next change; a container whose namespace
// is gone is skipped; invalid tables change nothing.
func TestServicesJoinRetryAndInvalid(t *testing.T) {
	d, lb := newLBDriver(t)
	if err := d.CreateNetwork(createNetReq("n1", 300)); err != nil {
		t.Fatal(err)
	}
	joinAt(t, d, "n1", "a", 1, "/run/docker/netns/a")
	if err := d.AddPeer("n1", dualPeer("r1", 2)); err != nil {
		t.Fatal(err)
	}
	svcs := []Service{{Name: "web", VIP: vip4, Endpoints: []string{"r1"}}}
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	joinAt(t, d, "n1", "b", 3, "/run/docker/netns/b")
	if b := backendsOf(t, lb, "/docker-netns/b")["web@10.1.0.2"]; len(b) != 1 {
		t.Fatalf("a container that joined later balances %v, want r1", b)
	}

	boom := errors.New("netlink says no")
	lb.SetFault(func(op fakelb.Op, ns string) error {
		if op == fakelb.OpApply && ns == "/docker-netns/a" {
			return boom
		}
		return nil
	})
	if err := d.AddPeer("n1", dualPeer("r2", 4)); err != nil {
		t.Fatal(err)
	}
	svcs[0].Endpoints = []string{"r1", "r2"}
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	if b := backendsOf(t, lb, "/docker-netns/a")["web@10.1.0.2"]; len(b) != 1 {
		t.Fatalf("container a: %v while its programming fails, want the old r1", b)
	}
	lb.SetFault(nil)
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatal(err)
	}
	if b := backendsOf(t, lb, "/docker-netns/a")["web@10.1.0.2"]; len(b) != 2 {
		t.Fatalf("container a after the fault: %v, want r1 and r2 (retried)", b)
	}

	lb.Vanish("/docker-netns/b")
	svcs[0].Endpoints = []string{"r2"}
	if err := d.SetServices("n1", svcs); err != nil {
		t.Fatalf("a vanished container namespace made SetServices fail: %v", err)
	}

	before := backendsOf(t, lb, "/docker-netns/a")
	for _, bad := range [][]Service{
		{{Name: "x", VIP: netip.Addr{}}},
		{{Name: "x", VIP: vip4}, {Name: "y", VIP: vip4}},
	} {
		if err := d.SetServices("n1", bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetServices(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	if err := d.SetServices("nosuch", svcs); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetServices on an unknown network = %v, want ErrNotFound", err)
	}
	if after := backendsOf(t, lb, "/docker-netns/a"); len(after) != len(before) {
		t.Errorf("refused tables changed the container: %v, was %v", after, before)
	}
	if _, err := d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: "a", SandboxKey: "relative/path"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Join with a relative SandboxKey = %v, want ErrInvalid", err)
	}
	if got := d.ServiceNetworks(); !slices.Equal(got, []string{"n1"}) {
		t.Errorf("ServiceNetworks = %v", got)
	}
}

// The watcher hears of every endpoint change of a network with containers
// here, and of none elsewhere.
func TestServiceWatchHearsEndpointChanges(t *testing.T) {
	d, _ := newLBDriver(t)
	var heard []string
	d.SetServiceWatch(func(nid string) { heard = append(heard, nid) })
	for _, n := range []string{"n1", "n2"} {
		if err := d.CreateNetwork(createNetReq(n, map[string]uint32{"n1": 300, "n2": 301}[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.AddPeer("n1", dualPeer("r0", 2)); err != nil {
		t.Fatal(err)
	}
	joinAt(t, d, "n1", "a", 1, "/run/docker/netns/a")
	if err := d.AddPeer("n1", dualPeer("r1", 3)); err != nil {
		t.Fatal(err)
	}
	if err := d.DeletePeer("n1", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := d.DeletePeer("n1", "never"); err != nil {
		t.Fatal(err)
	}
	if err := d.AddPeer("n2", dualPeer("r2", 4)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"n1", "n1", "n1"}; !slices.Equal(heard, want) {
		t.Errorf("the watcher heard %v, want %v (join, add, delete on n1; nothing before a container or on n2)", heard, want)
	}
}

// A container on two networks balances both networks' services in one
// table; leaving one network withdraws only that network's.
func TestServicesOfTwoNetworksShareTheContainer(t *testing.T) {
	d, lb := newLBDriver(t)
	for n, v := range map[string]uint32{"n1": 300, "n2": 301} {
		req := createNetReq(n, v)
		if n == "n2" {
			req.IPv4Data = []*api.IPAMData{{Pool: "10.2.0.0/16", Gateway: "10.2.0.1/16"}}
			req.IPv6Data = nil
		}
		if err := d.CreateNetwork(req); err != nil {
			t.Fatal(err)
		}
	}
	joinAt(t, d, "n1", "cn1", 1, "/run/docker/netns/c")
	if _, err := d.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: "n2", EndpointID: "cn2",
		Interface: &api.EndpointInterface{Address: "10.2.0.11/16"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Join(&api.JoinRequest{NetworkID: "n2", EndpointID: "cn2", SandboxKey: "/run/docker/netns/c"}); err != nil {
		t.Fatal(err)
	}
	if err := d.AddPeer("n1", dualPeer("r1", 2)); err != nil {
		t.Fatal(err)
	}
	r2 := peerdb.Peer{EndpointID: "r2", MAC: hwaddr.MAC{2, 0x42, 10, 2, 0, 12}, IPs: []netip.Addr{netip.MustParseAddr("10.2.0.12")},
		VTEP: netip.MustParseAddr("198.51.100.12")}
	if err := d.AddPeer("n2", r2); err != nil {
		t.Fatal(err)
	}
	must(t, d.SetServices("n1", []Service{{Name: "web", VIP: vip4, Endpoints: []string{"r1"}}}))
	must(t, d.SetServices("n2", []Service{{Name: "db", VIP: netip.MustParseAddr("10.2.0.2"), Endpoints: []string{"r2"}}}))
	ns := "/docker-netns/c"
	if got := backendsOf(t, lb, ns); len(got) != 2 || len(got["web@10.1.0.2"]) != 1 || len(got["db@10.2.0.2"]) != 1 {
		t.Fatalf("the container on both networks balances %v, want web (n1) and db (n2)", got)
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n2", EndpointID: "cn2"}))
	if got := backendsOf(t, lb, ns); len(got) != 1 || len(got["web@10.1.0.2"]) != 1 {
		t.Fatalf("after leaving n2 the container balances %v, want n1's web only", got)
	}
}

// A container adopted at restart whose services went while the plugin was
// down loses the previous run's table; one whose services remain keeps
// balancing them.
func TestServicesAfterRestart(t *testing.T) {
	k, db, lb := fakekernel.New(), testDB(t), fakelb.New()
	d := newLBDriverWith(t, k, db, lb)
	for n, v := range map[string]uint32{"n1": 300, "n2": 301} {
		must(t, d.CreateNetwork(createNetReq(n, v)))
	}
	joinAt(t, d, "n1", "a", 1, "/run/docker/netns/a")
	joinAt(t, d, "n2", "b", 1, "/run/docker/netns/b")
	must(t, d.AddPeer("n1", dualPeer("r1", 2)))
	must(t, d.AddPeer("n2", dualPeer("r2", 2)))
	must(t, d.SetServices("n1", []Service{{Name: "web", VIP: vip4, Endpoints: []string{"r1"}}}))
	must(t, d.SetServices("n2", []Service{{Name: "api", VIP: vip4, Endpoints: []string{"r2"}}}))
	d.Close()

	d2 := newLBDriverWith(t, k, db, lb)
	must(t, d2.AddPeer("n1", dualPeer("r1", 2)))
	must(t, d2.SetServices("n1", nil)) // web went while the plugin was down
	if svcs, ok := lb.Services("/docker-netns/a"); ok {
		t.Errorf("container a kept the previous run's table %v though n1 has no service now", svcs)
	}
	must(t, d2.AddPeer("n2", dualPeer("r2", 2)))
	must(t, d2.SetServices("n2", []Service{{Name: "api", VIP: vip4, Endpoints: []string{"r2"}}}))
	if b := backendsOf(t, lb, "/docker-netns/b")["api@10.1.0.2"]; len(b) != 1 {
		t.Errorf("container b after the restart balances %v, want r2", b)
	}
}
