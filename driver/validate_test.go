package driver

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// epIface is a CreateEndpoint request for e9 in n1 with the given fields.
func epIface(v4, v6, mac string) *api.CreateEndpointRequest {
	return &api.CreateEndpointRequest{NetworkID: "n1", EndpointID: "e9",
		Interface: &api.EndpointInterface{Address: v4, AddressIPv6: v6, MacAddress: mac}}
}

// Every refusal of CreateEndpoint leaves the driver, the state database and
// the kernel as they were. The network (createNetReq) has 10.1.0.0/16 with
// gateway 10.1.0.1 and fd00:1::/64; e1 is local (10.1.0.11, fd00:1::b),
// r1 remote.
func TestCreateEndpointRefusals(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", "198.51.100.2")))
	e1MAC := d.State()[0].Endpoints[0].MAC.String()

	cases := []struct {
		name string
		req  *api.CreateEndpointRequest
		want error
	}{
		{"network address", epIface("10.1.0.0/16", "", ""), ErrInvalid},
		{"broadcast address", epIface("10.1.255.255/16", "", ""), ErrInvalid},
		{"gateway", epIface("10.1.0.1/16", "", ""), ErrInvalid},
		{"IPv6 network address", epIface("", "fd00:1::/64", ""), ErrInvalid},
		{"/0", epIface("10.1.0.9/0", "", ""), ErrInvalid},
		{"outside every pool", epIface("10.2.0.9/16", "", ""), ErrInvalid},
		{"IPv6 outside every pool", epIface("10.1.0.9/16", "fd00:2::9/64", ""), ErrInvalid},
		{"IPv4 as AddressIPv6", epIface("", "10.1.0.9/16", ""), ErrInvalid},
		{"IPv4 in both fields", epIface("10.1.0.9/16", "10.1.0.9/16", ""), ErrInvalid},
		{"IPv4-mapped as AddressIPv6", epIface("", "::ffff:10.1.0.9/112", ""), ErrInvalid},
		{"IPv6 as Address", epIface("fd00:1::9/64", "", ""), ErrInvalid},
		{"multicast MAC", epIface("10.1.0.9/16", "", "01:00:5e:00:00:01"), ErrInvalid},
		{"zero MAC", epIface("10.1.0.9/16", "", "00:00:00:00:00:00"), ErrInvalid},
		{"IPv4 of a local endpoint", epIface("10.1.0.11/16", "fd00:1::99/64", ""), ErrConflict},
		{"IPv6 of a local endpoint", epIface("10.1.0.99/16", "fd00:1::b/64", ""), ErrConflict},
		{"MAC of a local endpoint", epIface("10.1.0.99/16", "", e1MAC), ErrConflict},
		{"id of a remote endpoint", &api.CreateEndpointRequest{NetworkID: "n1", EndpointID: "r1",
			Interface: &api.EndpointInterface{Address: "10.1.0.99/16"}}, ErrConflict},
	}
	state, kern := d.State(), k.Snapshot()
	for _, c := range cases {
		if _, err := d.CreateEndpoint(c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: CreateEndpoint = %v, want %v", c.name, err, c.want)
		}
		if got := d.State(); !reflect.DeepEqual(got, state) {
			t.Errorf("%s: driver state changed:\nbefore %+v\nafter  %+v", c.name, state, got)
		}
		if got := k.Snapshot(); !reflect.DeepEqual(got, kern) {
			t.Errorf("%s: kernel changed:\nbefore %+v\nafter  %+v", c.name, kern, got)
		}
		if _, eps, _, _ := d.store.load(); len(eps["n1"]) != 1 {
			t.Errorf("%s: %d endpoints stored, want e1 alone", c.name, len(eps["n1"]))
		}
	}
}

// A remote endpoint that still holds an IP does not stop a local endpoint
// from taking it: swarm reuses an address soon after a task left another
// host, before that host's retraction may have arrived. The local endpoint
// owns the IP meanwhile, and nothing remote is programmed for it.
func TestCreateEndpointTakesAnIPARemotePeerStillHolds(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.12", "02:42:0a:01:00:0c", "198.51.100.2")))
	createJoined(t, d, "e2", 2) // 10.1.0.12
	if _, ok := k.Snapshot()["n1"].Neighbors[netip.MustParseAddr("10.1.0.12")]; ok {
		t.Fatal("the remote claim on the local endpoint's IP is programmed")
	}
}

// A remote peer is held to the addresses a local endpoint is: whatever
// CreateEndpoint refuses to claim, AddPeer (gossip, admin API) refuses
// too, and leaves the peer table and the kernel alone.
func TestAddPeerRefusesWhatCreateEndpointRefuses(t *testing.T) {
	d, k := newFake(t)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	createJoined(t, d, "e1", 1)
	for _, c := range []struct{ name, ip, mac string }{
		{"network address", "10.1.0.0", "02:00:00:00:00:50"},
		{"broadcast address", "10.1.255.255", "02:00:00:00:00:50"},
		{"gateway", "10.1.0.1", "02:00:00:00:00:50"},
		{"IPv6 network address", "fd00:1::", "02:00:00:00:00:50"},
		{"outside every pool", "10.2.0.9", "02:00:00:00:00:50"},
		{"multicast MAC", "10.1.0.50", "01:00:5e:00:00:01"},
		{"zero MAC", "10.1.0.50", "00:00:00:00:00:00"},
	} {
		state, kern := d.State(), k.Snapshot()
		if err := d.AddPeer("n1", remotePeer("r1", c.ip, c.mac, "198.51.100.2")); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: AddPeer = %v, want ErrInvalid", c.name, err)
		}
		if got := d.State(); !reflect.DeepEqual(got, state) {
			t.Errorf("%s: driver state changed:\nbefore %+v\nafter  %+v", c.name, state, got)
		}
		if got := k.Snapshot(); !reflect.DeepEqual(got, kern) {
			t.Errorf("%s: kernel changed:\nbefore %+v\nafter  %+v", c.name, kern, got)
		}
	}
}

// A network stored by an earlier release has no gateways: it still loads,
// and a network's gateway survives a restart.
func TestGatewayStored(t *testing.T) {
	db := testDB(t)
	k := fakekernel.New()
	d := newTestDriverWith(t, k, localVTEP, db, false)
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	d.Close()
	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	if _, err := d2.CreateEndpoint(epIface("10.1.0.1/16", "", "")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("gateway after a restart: CreateEndpoint = %v, want ErrInvalid", err)
	}
	old := netRecord{ID: "old", VNI: 301, Subnets: []netip.Prefix{netip.MustParsePrefix("10.3.0.0/16")}}
	must(t, d2.store.put(bucketNetworks, old.ID, old))
	d2.Close()
	d3 := newTestDriverWith(t, k, localVTEP, db, false)
	if len(d3.State()) != 2 {
		t.Fatalf("networks after a restart: %+v, want n1 and old", d3.State())
	}
	_, err := d3.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: "old", EndpointID: "e1",
		Interface: &api.EndpointInterface{Address: "10.3.0.1/16"}})
	must(t, err)
}
