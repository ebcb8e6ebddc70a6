package pluginapi_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/metrics"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/pluginapi"
	"github.com/overlay-plugin/overlay-plugin/pluginapi/pluginapitest"
)

// pluginServer serves Docker's API for td the way serve does: the
// handler over a gate over the driver.
func pluginServer(t *testing.T, td testDriver) *httptest.Server {
	t.Helper()
	log := testLogger(t)
	g := pluginapi.NewGate[*driver.Driver](log, time.Second, metrics.NewCalls())
	g.SetDriver(td.drv)
	srv := httptest.NewServer(pluginapi.NewHandler(g, log))
	t.Cleanup(srv.Close)
	return srv
}

func TestPluginAPIHappyPath(t *testing.T) {
	td := newTestDriver(t)
	srv := pluginServer(t, td)
	c, u := srv.Client(), srv.URL

	var caps map[string]any
	pluginapitest.Post(t, c, u, "/NetworkDriver.GetCapabilities", nil).OK(t, "GetCapabilities", &caps)
	if want := map[string]any{"Scope": "global", "ConnectivityScope": "global"}; !reflect.DeepEqual(caps, want) {
		t.Errorf("GetCapabilities = %v, want %v", caps, want)
	}
	// Legacy activation still answers the manifest.
	if r := pluginapitest.Post(t, c, u, "/Plugin.Activate", nil); r.Status != 200 || !strings.Contains(string(r.Body), "NetworkDriver") {
		t.Errorf("Plugin.Activate: %d %s", r.Status, r.Body)
	}

	// AllocateNetwork, on the leader: the user's options come back with a VNI.
	const nid = "r2x8b6ng4cr1q0j6q9ypkqvun" // swarm's base-36 form
	user := map[string]string{"com.docker.network.driver.mtu": "1400", "com.docker.network.something": "x"}
	var alloc api.AllocateNetworkResponse
	pluginapitest.Post(t, c, u, "/NetworkDriver.AllocateNetwork", map[string]any{"NetworkID": nid, "Options": user,
		"IPv4Data": []map[string]any{{"Pool": "203.0.113.0/24"}}, "IPv6Data": nil}).OK(t, "AllocateNetwork", &alloc)
	want := maps.Clone(user)
	want["vxlanid_list"] = "256"
	if !reflect.DeepEqual(alloc.Options, want) {
		t.Fatalf("AllocateNetwork options = %v, want %v", alloc.Options, want)
	}
	// A new leader calls again with what was returned: same answer.
	var again api.AllocateNetworkResponse
	pluginapitest.Post(t, c, u, "/NetworkDriver.AllocateNetwork", map[string]any{"NetworkID": nid, "Options": alloc.Options}).OK(t, "AllocateNetwork again", &again)
	if !reflect.DeepEqual(again.Options, alloc.Options) {
		t.Errorf("second AllocateNetwork = %v, want %v", again.Options, alloc.Options)
	}
	if v, ok := td.vnis.Lookup(nid); !ok || v != 256 {
		t.Errorf("VNI table: %d %v, want 256", v, ok)
	}

	// On a node: CreateNetwork with the allocated options.
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork(nid, alloc.Options, "203.0.113.0/24")).OK(t, "CreateNetwork", nil)
	st := td.drv.State()
	if len(st) != 1 || st[0].ID != nid || st[0].VNI != 256 || st[0].Sandbox != "" {
		t.Fatalf("state after CreateNetwork: %+v", st)
	}

	// CreateEndpoint without a MAC: one is assigned and returned.
	var ep1 api.CreateEndpointResponse
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": nid, "EndpointID": "ep1",
		"Interface": map[string]any{"Address": "203.0.113.2/24"}, "Options": map[string]any{}}).OK(t, "CreateEndpoint ep1", &ep1)
	if ep1.Interface == nil || ep1.Interface.MacAddress == "" {
		t.Fatalf("CreateEndpoint without MAC returned %+v, want a MAC", ep1.Interface)
	}
	mac, err := hwaddr.Parse(ep1.Interface.MacAddress)
	if err != nil || mac[0]&1 != 0 || mac[0]&2 == 0 {
		t.Errorf("assigned MAC %s: want a locally administered unicast address (%v)", ep1.Interface.MacAddress, err)
	}
	if ep1.Interface.Address != "" || ep1.Interface.AddressIPv6 != "" {
		t.Errorf("CreateEndpoint echoed addresses: %+v", ep1.Interface)
	}
	// With a MAC: nothing is returned (Docker rejects an echo).
	r := pluginapitest.Post(t, c, u, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": nid, "EndpointID": "ep2",
		"Interface": map[string]any{"Address": "203.0.113.3/24", "MacAddress": "02:42:cb:00:71:03"}})
	var ep2 api.CreateEndpointResponse
	r.OK(t, "CreateEndpoint ep2", &ep2)
	if ep2.Interface != nil {
		t.Errorf("CreateEndpoint with a MAC returned %s, want no Interface", r.Body)
	}

	var info api.InfoResponse
	pluginapitest.Post(t, c, u, "/NetworkDriver.EndpointOperInfo", map[string]any{"NetworkID": nid, "EndpointID": "ep1"}).OK(t, "EndpointOperInfo", &info)
	if info.Value["mac"] != ep1.Interface.MacAddress || info.Value["vni"] != "256" {
		t.Errorf("EndpointOperInfo = %v", info.Value)
	}

	// Join: the sandbox is built, the host end of a veth handed over.
	var join api.JoinResponse
	pluginapitest.Post(t, c, u, "/NetworkDriver.Join", map[string]any{"NetworkID": nid, "EndpointID": "ep1",
		"SandboxKey": "/var/run/docker/netns/abc", "Options": map[string]any{}}).OK(t, "Join", &join)
	if join.InterfaceName.SrcName == "" || join.InterfaceName.DstPrefix != "eth" {
		t.Errorf("Join interface = %+v, want a SrcName and DstPrefix eth", join.InterfaceName)
	}
	snap := td.kernel.Snapshot()
	sb, ok := snap[nid]
	if !ok || sb.Spec.VNI != 256 || sb.Spec.MTU != 1400 || len(sb.Veths) != 1 {
		t.Fatalf("kernel after Join: %+v", snap)
	}
	for _, v := range sb.Veths {
		if v.HostName != join.InterfaceName.SrcName || v.MAC != mac {
			t.Errorf("veth %+v, want host end %s with MAC %s", v, join.InterfaceName.SrcName, mac)
		}
	}
	pluginapitest.Post(t, c, u, "/NetworkDriver.ProgramExternalConnectivity", map[string]any{"NetworkID": nid, "EndpointID": "ep1"}).OK(t, "ProgramExternalConnectivity", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.RevokeExternalConnectivity", map[string]any{"NetworkID": nid, "EndpointID": "ep1"}).OK(t, "RevokeExternalConnectivity", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.DiscoverNew", map[string]any{"DiscoveryType": 1,
		"DiscoveryData": map[string]any{"Address": "198.51.100.7", "BindAddress": "", "Self": false}}).OK(t, "DiscoverNew", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.DiscoverDelete", map[string]any{"DiscoveryType": 1,
		"DiscoveryData": map[string]any{"Address": "198.51.100.7", "BindAddress": "", "Self": false}}).OK(t, "DiscoverDelete", nil)

	// Teardown in Docker's order.
	pluginapitest.Post(t, c, u, "/NetworkDriver.Leave", map[string]any{"NetworkID": nid, "EndpointID": "ep1"}).OK(t, "Leave", nil)
	if snap := td.kernel.Snapshot(); len(snap) != 0 {
		t.Errorf("sandbox left after the last Leave: %v", snap)
	}
	pluginapitest.Post(t, c, u, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": nid, "EndpointID": "ep1"}).OK(t, "DeleteEndpoint ep1", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": nid, "EndpointID": "ep2"}).OK(t, "DeleteEndpoint ep2", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.DeleteNetwork", map[string]any{"NetworkID": nid}).OK(t, "DeleteNetwork", nil)
	if st := td.drv.State(); len(st) != 0 {
		t.Errorf("state after DeleteNetwork: %+v", st)
	}
	pluginapitest.Post(t, c, u, "/NetworkDriver.FreeNetwork", map[string]any{"NetworkID": nid}).OK(t, "FreeNetwork", nil)
	if _, ok := td.vnis.Lookup(nid); ok {
		t.Errorf("VNI still held after FreeNetwork")
	}
}

func TestPluginAPIBadInput(t *testing.T) {
	td := newTestDriver(t)
	srv := pluginServer(t, td)
	c, u := srv.Client(), srv.URL

	// Something to leave untouched: a network with a joined endpoint, an
	// unjoined one, and a remote peer; and a second network.
	const nid, other = "net1", "net2"
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork(nid, map[string]string{"vxlanid_list": "300"}, "203.0.113.0/25")).OK(t, "CreateNetwork", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork(other, map[string]string{"vxlanid_list": "301"}, "203.0.113.128/25")).OK(t, "CreateNetwork", nil)
	for _, ep := range []struct{ id, addr string }{{"ep1", "203.0.113.2/25"}, {"ep2", "203.0.113.3/25"}} {
		pluginapitest.Post(t, c, u, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": nid, "EndpointID": ep.id,
			"Interface": map[string]any{"Address": ep.addr}}).OK(t, "CreateEndpoint", nil)
	}
	pluginapitest.Post(t, c, u, "/NetworkDriver.Join", map[string]any{"NetworkID": nid, "EndpointID": "ep1", "SandboxKey": "/x"}).OK(t, "Join", nil)
	if err := td.drv.AddPeer(nid, peerdb.Peer{EndpointID: "remote1", IPs: []netip.Addr{netip.MustParseAddr("203.0.113.9")},
		MAC: hwaddr.MAC{2, 0x42, 0, 0, 0, 9}, VTEP: netip.MustParseAddr("198.51.100.2")}); err != nil {
		t.Fatal(err)
	}
	pluginapitest.Post(t, c, u, "/NetworkDriver.AllocateNetwork", map[string]any{"NetworkID": "alloc1", "Options": map[string]string{}}).OK(t, "AllocateNetwork", nil)

	before := td.drv.State()
	kernelBefore := td.kernel.Snapshot()
	if len(before) != 2 || before[0].Kernel == nil || len(before[0].Kernel.Neighbors) != 1 {
		t.Fatalf("setup: %+v", before)
	}

	createEP := func(nid, eid string, iface any) map[string]any {
		return map[string]any{"NetworkID": nid, "EndpointID": eid, "Interface": iface}
	}
	alloc := func(nid string, opts map[string]string) map[string]any {
		return map[string]any{"NetworkID": nid, "Options": opts, "IPv4Data": []map[string]any{{"Pool": "198.18.0.0/24"}}}
	}
	type tc struct {
		name, path string
		body       any
		want       string // in the message
		status     int    // 0: 500, what go-plugins-helpers answers for a driver error
	}
	cases := []tc{
		// Not JSON, or not the right JSON.
		{"malformed JSON", "/NetworkDriver.CreateNetwork", `{"NetworkID": "x",`, "malformed JSON", 400},
		{"not an object", "/NetworkDriver.Join", `[1,2]`, "malformed JSON", 400},
		{"wrong field type", "/NetworkDriver.CreateEndpoint", `{"NetworkID": 5}`, "malformed JSON", 400},
		{"empty body", "/NetworkDriver.DeleteNetwork", nil, "empty request body", 400},
		{"garbage", "/NetworkDriver.AllocateNetwork", "\x00\x01\x02", "malformed JSON", 400},
		{"unknown call", "/NetworkDriver.Frobnicate", `{}`, "not a call of the network driver API", 404},
		{"trailing data", "/NetworkDriver.CreateNetwork", `{"NetworkID": "x"} {"NetworkID": "y"}`, "trailing data after the JSON request", 400},
		{"trailing garbage", "/NetworkDriver.DeleteNetwork", `{"NetworkID": "x"}garbage`, "trailing data", 400},
		{"oversize body", "/NetworkDriver.CreateNetwork", `{"NetworkID":"` + strings.Repeat("a", pluginapi.MaxBody) + `"}`, "larger than", 413},

		// Missing or bad ids.
		{"CreateNetwork no id", "/NetworkDriver.CreateNetwork", `{}`, "empty network id", 0},
		{"CreateNetwork bad id", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("../etc", map[string]string{"vxlanid_list": "400"}, "198.18.0.0/24"), "character other than a letter or digit", 0},
		{"CreateEndpoint no id", "/NetworkDriver.CreateEndpoint", createEP(nid, "", map[string]any{"Address": "203.0.113.4/25"}), "empty endpoint id", 0},
		{"Join no ids", "/NetworkDriver.Join", `{}`, "empty endpoint id", 0},
		{"Leave no ids", "/NetworkDriver.Leave", `{}`, "empty endpoint id", 0},
		{"FreeNetwork no id", "/NetworkDriver.FreeNetwork", `{}`, "empty network id", 0},
		{"AllocateNetwork no id", "/NetworkDriver.AllocateNetwork", `{}`, "empty network id", 0},

		// Unknown networks and endpoints.
		{"DeleteNetwork unknown", "/NetworkDriver.DeleteNetwork", map[string]any{"NetworkID": "nosuch"}, "network nosuch: not found", 0},
		{"CreateEndpoint unknown network", "/NetworkDriver.CreateEndpoint", createEP("nosuch", "ep9", map[string]any{"Address": "203.0.113.4/25"}), "network nosuch: not found", 0},
		{"DeleteEndpoint unknown", "/NetworkDriver.DeleteEndpoint", map[string]any{"NetworkID": nid, "EndpointID": "nosuch"}, "endpoint nosuch in network net1: not found", 0},
		{"EndpointOperInfo unknown", "/NetworkDriver.EndpointOperInfo", map[string]any{"NetworkID": nid, "EndpointID": "nosuch"}, "not found", 0},
		{"Join unknown endpoint", "/NetworkDriver.Join", map[string]any{"NetworkID": nid, "EndpointID": "nosuch", "SandboxKey": "/x"}, "endpoint nosuch in network net1: not found", 0},
		{"Join unknown network", "/NetworkDriver.Join", map[string]any{"NetworkID": "nosuch", "EndpointID": "ep1", "SandboxKey": "/x"}, "network nosuch: not found", 0},
		{"Leave unknown", "/NetworkDriver.Leave", map[string]any{"NetworkID": nid, "EndpointID": "nosuch"}, "not found", 0},
		{"Leave endpoint of other network", "/NetworkDriver.Leave", map[string]any{"NetworkID": other, "EndpointID": "ep1"}, "endpoint ep1 in network net2: not found", 0},
		{"ProgramExternalConnectivity unknown", "/NetworkDriver.ProgramExternalConnectivity", map[string]any{"NetworkID": nid, "EndpointID": "nosuch"}, "not found", 0},
		{"RevokeExternalConnectivity unknown", "/NetworkDriver.RevokeExternalConnectivity", map[string]any{"NetworkID": "nosuch", "EndpointID": "ep1"}, "not found", 0},

		// Bad options: at allocation on the leader...
		{"AllocateNetwork unknown option", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlan_id": "5"}), `unknown network option "vxlan_id"`, 0},
		{"AllocateNetwork VNI 0", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlanid_list": "0"}), "a VNI is between 1 and 16777215", 0},
		{"AllocateNetwork VNI 5000", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlanid_list": "5000"}), "VNI 5000 is outside the allowed range 1-4095", 0},
		{"AllocateNetwork VNI list", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlanid_list": "1,2"}), "give exactly one", 0},
		{"AllocateNetwork VNI not a number", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlanid_list": "abc"}), "not a number", 0},
		{"AllocateNetwork bad MTU", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"com.docker.network.driver.mtu": "100"}), "want an MTU between 1280 and 65535", 0},
		{"AllocateNetwork VNI taken", "/NetworkDriver.AllocateNetwork", alloc("alloc2", map[string]string{"vxlanid_list": "256"}), "VNI 256 is already used by network alloc1", 0},
		// ...and on a node.
		{"CreateNetwork without vxlanid_list", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", nil, "198.18.0.0/24"), "has no vxlanid_list option", 0},
		{"CreateNetwork unknown option", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "400", "colour": "blue"}, "198.18.0.0/24"), `unknown network option "colour"`, 0},
		{"CreateNetwork VNI 0", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "0"}, "198.18.0.0/24"), "a VNI is between 1 and 16777215", 0},
		{"CreateNetwork VNI list", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "1,2"}, "198.18.0.0/24"), "give exactly one", 0},
		{"CreateNetwork encrypted", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "400", "encrypted": ""}, "198.18.0.0/24"), "--secret-file", 0},
		{"CreateNetwork generic not an object", "/NetworkDriver.CreateNetwork", map[string]any{"NetworkID": "net3", "Options": map[string]any{pluginapitest.GenericKey: "vxlanid_list=5"}}, "want an object of strings", 0},
		{"CreateNetwork option not a string", "/NetworkDriver.CreateNetwork", map[string]any{"NetworkID": "net3", "Options": map[string]any{pluginapitest.GenericKey: map[string]any{"vxlanid_list": 400}}}, "want a string", 0},
		{"CreateNetwork bad pool", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "400"}, "203.0.113.0"), `IPAM pool "203.0.113.0"`, 0},
		{"CreateNetwork exists", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork(nid, map[string]string{"vxlanid_list": "300"}, "203.0.113.0/25"), "network net1 exists already", 0},
		{"CreateNetwork VNI in use", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net3", map[string]string{"vxlanid_list": "300"}, "198.18.0.0/24"), "VNI 300 is used by network net1", 0},

		// Bad endpoints.
		{"CreateEndpoint no Interface", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", nil), "no Interface", 0},
		{"CreateEndpoint no address", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{}), "no IPv4 or IPv6 address", 0},
		{"CreateEndpoint address outside subnet", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{"Address": "198.18.0.5/24"}), "address 198.18.0.5 is in no subnet of network net1", 0},
		{"CreateEndpoint address without prefix", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{"Address": "203.0.113.4"}), "want address/prefix-length", 0},
		{"CreateEndpoint IPv6 in IPv4 field", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{"Address": "2001:db8::4/64"}), "wrong field", 0},
		{"CreateEndpoint bad MAC", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{"Address": "203.0.113.4/25", "MacAddress": "not-a-mac"}), "invalid MAC address", 0},
		{"CreateEndpoint multicast MAC", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep9", map[string]any{"Address": "203.0.113.4/25", "MacAddress": "01:00:5e:00:00:01"}), "is not a unicast address", 0},
		{"CreateEndpoint exists", "/NetworkDriver.CreateEndpoint", createEP(nid, "ep2", map[string]any{"Address": "203.0.113.3/25"}), "endpoint ep2 exists already", 0},

		// Out-of-order calls.
		{"Join twice", "/NetworkDriver.Join", map[string]any{"NetworkID": nid, "EndpointID": "ep1", "SandboxKey": "/x"}, "endpoint ep1 is joined already", 0},

		// Discovery data that is not what Docker sends.
		{"DiscoverNew bad data", "/NetworkDriver.DiscoverNew", map[string]any{"DiscoveryType": 1, "DiscoveryData": "x"}, "node discovery data", 0},
		{"DiscoverNew bad address", "/NetworkDriver.DiscoverNew", map[string]any{"DiscoveryType": 1, "DiscoveryData": map[string]any{"Address": "nowhere", "Self": true}}, `node discovery Address "nowhere"`, 0},
		{"DiscoverDelete no data", "/NetworkDriver.DiscoverDelete", map[string]any{"DiscoveryType": 1}, "node discovery data", 0},
	}
	for _, c2 := range cases {
		t.Run(c2.name, func(t *testing.T) {
			r := pluginapitest.Post(t, c, u, c2.path, c2.body)
			msg := r.ErrMsg(t, c2.path)
			want := c2.status
			if want == 0 {
				want = http.StatusInternalServerError
			}
			if r.Status != want {
				t.Errorf("HTTP %d, want %d (%s)", r.Status, want, msg)
			}
			if !strings.Contains(msg, c2.want) {
				t.Errorf("message %q does not say %q", msg, c2.want)
			}
			if after := served(td.drv.State()); !reflect.DeepEqual(after, before) {
				t.Errorf("state changed:\nbefore %+v\nafter  %+v", before, after)
			}
			if after := td.kernel.Snapshot(); !reflect.DeepEqual(after, kernelBefore) {
				t.Errorf("kernel changed:\nbefore %+v\nafter  %+v", kernelBefore, after)
			}
			for _, id := range []string{"alloc2", "net3", "../etc"} {
				if v, ok := td.vnis.Lookup(id); ok {
					t.Errorf("network %s got VNI %d", id, v)
				}
			}
		})
	}
	// The one refusal an operator must see: the encrypted network.
	if st := td.drv.State(); len(st) != 3 || st[2].ID != "net3" || st[2].Refused == nil {
		t.Errorf("state does not name the refused encrypted network: %+v", st)
	}
}

// served drops the networks the driver only lists as refused.
func served(st []driver.NetworkState) []driver.NetworkState {
	return slices.DeleteFunc(st, func(n driver.NetworkState) bool { return n.Refused != nil && n.VNI == 0 })
}

// A kernel failure during Join reaches Docker as a clear error, and the
// driver is left as it was.
func TestPluginAPIKernelFailure(t *testing.T) {
	td := newTestDriver(t)
	srv := pluginServer(t, td)
	c, u := srv.Client(), srv.URL
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("n1", map[string]string{"vxlanid_list": "300"}, "203.0.113.0/24")).OK(t, "CreateNetwork", nil)
	pluginapitest.Post(t, c, u, "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "n1", "EndpointID": "e1",
		"Interface": map[string]any{"Address": "203.0.113.2/24"}}).OK(t, "CreateEndpoint", nil)
	before := td.drv.State()
	td.kernel.SetFault(func(op fakekernel.Op, _ string) error {
		if op == fakekernel.OpAddVeth {
			return fmt.Errorf("injected: no space left on device")
		}
		return nil
	})
	msg := pluginapitest.Post(t, c, u, "/NetworkDriver.Join", map[string]any{"NetworkID": "n1", "EndpointID": "e1", "SandboxKey": "/x"}).ErrMsg(t, "Join")
	if !strings.Contains(msg, "injected: no space left on device") {
		t.Errorf("message %q", msg)
	}
	after := td.drv.State()
	// The driver keeps the MTU of a sandbox it removed (harmless: the next
	// sandbox sets it again); compare what matters.
	for i := range after {
		if after[i].Sandbox == "" {
			after[i].MTU = 0
		}
	}
	if !reflect.DeepEqual(after, before) {
		t.Errorf("state changed:\nbefore %+v\nafter  %+v", before, after)
	}
	if snap := td.kernel.Snapshot(); len(snap) != 0 {
		t.Errorf("sandbox left behind: %v", snap)
	}
}

// A panic in the driver is an error answer, not a dead plugin.
func TestGateRecoversPanic(t *testing.T) {
	g := pluginapi.NewGate[api.Driver](testLogger(t), time.Second, metrics.NewCalls())
	g.SetDriver(panicky{})
	srv := httptest.NewServer(pluginapi.NewHandler(g, testLogger(t)))
	defer srv.Close()
	msg := pluginapitest.Post(t, srv.Client(), srv.URL, "/NetworkDriver.GetCapabilities", nil).ErrMsg(t, "GetCapabilities")
	if !strings.Contains(msg, "internal error") {
		t.Errorf("message %q", msg)
	}
	if n := g.InFlight(); n != 0 {
		t.Errorf("%d calls still counted in flight", n)
	}
}

type panicky struct{ api.Driver }

func (panicky) GetCapabilities() (*api.CapabilitiesResponse, error) { panic("boom") }

// Every call of Docker's plugin API is a POST; anything else is refused
// with a clear {"Err"} rather than handed to the driver.
func TestPluginAPIRefusesOtherMethods(t *testing.T) {
	srv := pluginServer(t, newTestDriver(t))
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(m, srv.URL+"/NetworkDriver.GetCapabilities", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Err string }
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(e.Err, "takes POST") {
			t.Errorf("%s: HTTP %d %q, want 405 and an error saying the API takes POST", m, resp.StatusCode, e.Err)
		}
	}
}
