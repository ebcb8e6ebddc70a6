package driver

import (
	"net/netip"
	"slices"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"
	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// The prober is handed the VTEPs that have entries in a sandbox, each with
// the largest MTU of the networks reaching it, and the encrypted ones'.
func TestRemoteVTEPs(t *testing.T) {
	d, _ := newEncryptedDriver(t, newFakeEncryption())
	must(t, d.CreateNetwork(createNetReq("n1", 300)))
	must(t, d.CreateNetwork(encryptedReq("n2", 301)))
	createJoined(t, d, "ep1", 1)
	if got := d.RemoteVTEPs(); len(got) != 0 {
		t.Fatalf("no remote endpoints, yet %v", got)
	}
	req := endpointReq("n2", "ep2", 2)
	_, err := d.CreateEndpoint(req)
	must(t, err)
	_, err = d.Join(&api.JoinRequest{NetworkID: "n2", EndpointID: "ep2"})
	must(t, err)
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:42:0a:01:00:32", "198.51.100.2")))
	must(t, d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:42:0a:01:00:33", "198.51.100.3")))
	must(t, d.AddPeer("n2", remotePeer("r3", "10.1.0.52", "02:42:0a:01:00:34", "198.51.100.3")))
	plain := 1500 - overheadIPv4
	want := []RemoteVTEP{
		{VTEP: netip.MustParseAddr("198.51.100.2"), MTU: plain},
		{VTEP: netip.MustParseAddr("198.51.100.3"), MTU: plain, ESPMTU: plain - encryption.Overhead},
	}
	if got := d.RemoteVTEPs(); !slices.Equal(got, want) {
		t.Fatalf("RemoteVTEPs() = %v, want %v", got, want)
	}
	must(t, d.DeletePeer("n1", "r1"))
	if got := d.RemoteVTEPs(); len(got) != 1 || got[0].VTEP != want[1].VTEP {
		t.Fatalf("after the only endpoint behind 198.51.100.2 left: %v", got)
	}
}

// The leader gives a network the MTU the smallest underlay allows, so that
// every host uses the same; a user's MTU option stays as given.
func TestAllocateTakesTheSmallestUnderlay(t *testing.T) {
	d, _ := newFake(t)
	alloc := func(id string, opts map[string]string) map[string]string {
		t.Helper()
		r, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: id, Options: opts})
		must(t, err)
		return r.Options
	}
	if got := alloc("n1", nil); got[OptMTU] != "" {
		t.Errorf("without the nodes' MTUs: %v", got)
	}
	d.SetMTUFloor(func() (int, string) { return 1400, "h2" })
	if got := alloc("n2", nil)[OptMTU]; got != "1350" {
		t.Errorf("MTU option %q, want 1350 (h2's underlay of 1400 less 50)", got)
	}
	if got := alloc("n3", map[string]string{OptMTU: "1300"})[OptMTU]; got != "1300" {
		t.Errorf("the user's MTU became %q", got)
	}
	d.SetMTUFloor(func() (int, string) { return 1200, "h5" })
	if got := alloc("n5", nil)[OptMTU]; got != "" {
		t.Errorf("an underlay below what the option accepts gave %q", got)
	}
	d.SetMTUFloor(func() (int, string) { return 9000, "h3" })
	if got := alloc("n4", nil)[OptMTU]; got != "1450" {
		t.Errorf("with this host's the smallest underlay: %q, want 1450", got)
	}
}
