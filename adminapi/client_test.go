package adminapi

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"syscall"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

func newDriver(t *testing.T) *driver.Driver {
	t.Helper()
	d, err := driver.New(driver.Config{Kernel: fakekernel.New(), Underlay: drivertest.Underlay{Addr: drivertest.VTEP},
		VNIs: drivertest.VNIs(t, drivertest.StateDB(t)), VXLANPort: 4789, AdvertiseAddr: drivertest.VTEP,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// serveUnix serves h on a unix socket in a temporary directory.
func serveUnix(t *testing.T, h http.Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return path
}

func TestClientRoundTrip(t *testing.T) {
	d := newDriver(t)
	var ready atomic.Bool
	c := NewClient(serveUnix(t, NewServer(d, ready.Load, nil)))
	defer c.Close()

	if ok, err := c.Healthy(); err != nil || ok {
		t.Fatalf("Healthy before ready = %v, %v; want false, nil", ok, err)
	}
	if _, err := c.Networks(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Networks before ready: %v, want ErrUnavailable", err)
	}
	ready.Store(true)
	if ok, err := c.Healthy(); err != nil || !ok {
		t.Fatalf("Healthy = %v, %v; want true, nil", ok, err)
	}

	nets, err := c.Networks()
	if err != nil || len(nets) != 0 {
		t.Fatalf("Networks = %v, %v; want none", nets, err)
	}

	// A network with one joined local endpoint, so the sandbox exists.
	const nid, eid = "n1", "local1"
	if err := d.CreateNetwork(&api.CreateNetworkRequest{NetworkID: nid,
		Options:  map[string]any{"com.docker.network.generic": map[string]any{"vxlanid_list": "300"}},
		IPv4Data: []*api.IPAMData{{Pool: "203.0.113.0/24", Gateway: "203.0.113.1/24"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: nid, EndpointID: eid,
		Interface: &api.EndpointInterface{Address: "203.0.113.2/24"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Join(&api.JoinRequest{NetworkID: nid, EndpointID: eid, SandboxKey: "/x"}); err != nil {
		t.Fatal(err)
	}

	peer := peerdb.Peer{EndpointID: "remote1", IPs: []netip.Addr{netip.MustParseAddr("203.0.113.9")},
		MAC: hwaddr.MAC{0x02, 0x42, 0, 0, 0, 9}, VTEP: netip.MustParseAddr("198.51.100.2")}
	if err := c.AddPeer(nid, peer); err != nil {
		t.Fatal(err)
	}

	nets, err = c.Networks()
	if err != nil {
		t.Fatal(err)
	}
	// What crossed the socket is what the driver holds.
	if want := d.State(); !reflect.DeepEqual(nets, want) {
		t.Errorf("Networks over the socket:\n%+v\ndriver state:\n%+v", nets, want)
	}
	if len(nets) != 1 || nets[0].Kernel == nil || len(nets[0].Kernel.Neighbors) != 1 ||
		nets[0].Kernel.Neighbors[0].IP != peer.IPs[0] || len(nets[0].Kernel.FDB) != 1 {
		t.Errorf("peer not programmed: %+v", nets)
	}

	// Errors come back matching the driver's sentinels.
	for _, c2 := range []struct {
		err  error
		want error
	}{
		{c.AddPeer("nosuch", peer), driver.ErrNotFound},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "x"}), driver.ErrInvalid},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: eid, IPs: peer.IPs, MAC: peer.MAC, VTEP: peer.VTEP}), driver.ErrConflict},
		// The id, addresses and MAC CreateEndpoint refuses, refused here too.
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "0-forged", IPs: peer.IPs, MAC: peer.MAC, VTEP: peer.VTEP}), driver.ErrInvalid},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "r2", IPs: []netip.Addr{netip.MustParseAddr("203.0.113.1")}, MAC: peer.MAC, VTEP: peer.VTEP}), driver.ErrInvalid},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "r2", IPs: []netip.Addr{netip.MustParseAddr("203.0.113.255")}, MAC: peer.MAC, VTEP: peer.VTEP}), driver.ErrInvalid},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "r2", IPs: []netip.Addr{netip.MustParseAddr("198.18.0.9")}, MAC: peer.MAC, VTEP: peer.VTEP}), driver.ErrInvalid},
		{c.AddPeer(nid, peerdb.Peer{EndpointID: "r2", IPs: peer.IPs, MAC: hwaddr.MAC{0x01, 0, 0x5e, 0, 0, 1}, VTEP: peer.VTEP}), driver.ErrInvalid},
		{c.DeletePeer(nid, eid), driver.ErrConflict},
		{c.DeletePeer("nosuch", "remote1"), driver.ErrNotFound},
		{c.DeletePeer(nid, "bad/id"), driver.ErrInvalid},
	} {
		var apiErr *Error
		if !errors.Is(c2.err, c2.want) || !errors.As(c2.err, &apiErr) || apiErr.Message == "" {
			t.Errorf("error %v: want %v with a message", c2.err, c2.want)
		}
	}

	if err := c.DeletePeer(nid, "remote1"); err != nil {
		t.Fatal(err)
	}
	// Deleting again is fine: deletes may repeat.
	if err := c.DeletePeer(nid, "remote1"); err != nil {
		t.Fatal(err)
	}
	nets, err = c.Networks()
	if err != nil || len(nets) != 1 || len(nets[0].Peers) != 1 || len(nets[0].Kernel.Neighbors) != 0 {
		t.Errorf("after delete: %+v, %v", nets, err)
	}
}

func TestClientNoServer(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "nothing.sock"))
	if _, err := c.Networks(); err == nil {
		t.Fatal("Networks with no server succeeded")
	} else if t.Log(err); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("error %v does not wrap the dial error", err)
	}
	if ok, err := c.Healthy(); ok || err == nil {
		t.Errorf("Healthy = %v, %v; want false and an error", ok, err)
	}
}
