package driver

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

var localVTEP = drivertest.VTEP

func newTestDriver(t testing.TB, k kernel.Kernel) *Driver {
	return newTestDriverAt(t, k, localVTEP)
}

func newTestDriverAt(t testing.TB, k kernel.Kernel, vtep netip.Addr) *Driver {
	t.Helper()
	return newTestDriverWith(t, k, vtep, testDB(t), false)
}

// testDB is a state database for one test, closed at its end.
func testDB(t testing.TB) *bbolt.DB { return drivertest.StateDB(t) }

// newTestDriverWith builds a driver on db, as a (re)started plugin does.
func newTestDriverWith(t testing.TB, k kernel.Kernel, vtep netip.Addr, db *bbolt.DB, expectEncryption bool) *Driver {
	t.Helper()
	cfg := testConfig(t, k, db)
	cfg.AdvertiseAddr, cfg.ExpectEncryption = vtep, expectEncryption
	return newFromConfig(t, cfg)
}

// testConfig is the configuration of a driver on k and db on the test
// host (drivertest), as a plugin opens it.
func testConfig(t testing.TB, k kernel.Kernel, db *bbolt.DB) Config {
	return Config{Kernel: k, Underlay: drivertest.Underlay{Addr: localVTEP}, VNIs: drivertest.VNIs(t, db), VXLANPort: 4789,
		AdvertiseAddr: localVTEP, DB: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func newFromConfig(t testing.TB, cfg Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func newFake(t testing.TB) (*Driver, *fakekernel.Kernel) {
	k := fakekernel.New()
	return newTestDriver(t, k), k
}

// createNet creates network id with VNI v and a dual-stack pool, as Docker
// would after AllocateNetwork.
func createNetReq(id string, v uint32) *api.CreateNetworkRequest {
	return &api.CreateNetworkRequest{
		NetworkID: id,
		Options:   map[string]any{genericOptionsKey: map[string]any{OptVNI: fmt.Sprint(v)}},
		IPv4Data:  []*api.IPAMData{{Pool: "10.1.0.0/16", Gateway: "10.1.0.1/16"}},
		IPv6Data:  []*api.IPAMData{{Pool: "fd00:1::/64"}},
	}
}

func endpointReq(nid, eid string, i int) *api.CreateEndpointRequest {
	return &api.CreateEndpointRequest{NetworkID: nid, EndpointID: eid, Interface: &api.EndpointInterface{
		Address:     fmt.Sprintf("10.1.0.%d/16", 10+i),
		AddressIPv6: fmt.Sprintf("fd00:1::%x/64", 10+i),
	}}
}

// createJoined creates endpoint eid (endpointReq's i-th addresses) in n1
// and joins it.
func createJoined(t *testing.T, d *Driver, eid string, i int) {
	t.Helper()
	_, err := d.CreateEndpoint(endpointReq("n1", eid, i))
	must(t, err)
	_, err = d.Join(&api.JoinRequest{NetworkID: "n1", EndpointID: eid})
	must(t, err)
}
