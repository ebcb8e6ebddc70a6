package driver

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// A lost state database leaves strays; the engine's list gives back the
// ones the sandbox holds, with their ids, addresses and MACs: stored,
// joined and published; the others are left out or refused, and what is
// refused changes nothing.
func TestRecoverEndpointsAfterStateLoss(t *testing.T) {
	k := fakekernel.New()
	k.AddLeftover(kernel.SandboxSpec{Name: "lost", VNI: 400, Port: 4789, Local: localVTEP, MTU: 1450})
	const e1, e2, e3 = "e1e1e1e1e1e1e1e1", "e2e2e2e2e2e2e2e2", "e3e3e3e3e3e3e3e3"
	runningContainer(t, k, "lost", e1)
	runningContainer(t, k, "lost", e2)
	runningContainer(t, k, "lost", e3)
	db := testDB(t)
	d := newTestDriverWith(t, k, localVTEP, db, false)
	if got := d.Strays(); !slices.Equal(got, []string{"lost"}) {
		t.Fatalf("strays in %v, want [lost]", got)
	}
	cp := &recordingCP{}
	d.SetControlPlane(cp)
	mac := func(b byte) hwaddr.MAC { return hwaddr.MAC{0x02, 0x42, 10, 1, 0, b} }
	pfx := func(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }
	got, err := d.RecoverEndpoints("lost", []RecoveredEndpoint{
		{ID: e1, MAC: mac(11), Addrs: pfx("10.1.0.11/16")},
		{ID: "notherenothere00", MAC: mac(12), Addrs: pfx("10.1.0.12/16")},         // no veth here: another host's
		{ID: e2, MAC: mac(11), Addrs: pfx("10.1.0.13/16")},                         // e1's MAC: refused
		{ID: e3, MAC: hwaddr.MAC{0x03, 0, 0, 0, 0, 1}, Addrs: pfx("10.1.0.14/16")}, // multicast MAC
	})
	if !slices.Equal(got, []string{e1}) || !errors.Is(err, ErrConflict) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("recovered %v, %v; want [%s] and a conflict and an invalid endpoint", got, err, e1)
	}
	st := d.State()
	if len(st[0].Endpoints) != 1 || st[0].Endpoints[0].ID != e1 || !st[0].Endpoints[0].Joined || st[0].Endpoints[0].MAC != mac(11) {
		t.Fatalf("endpoints after the recovery: %+v", st[0].Endpoints)
	}
	if !slices.Contains(cp.published, "lost/"+e1) {
		t.Fatalf("published %v, want lost/%s", cp.published, e1)
	}
	if got := d.Strays(); !slices.Equal(got, []string{"lost"}) {
		t.Fatalf("strays in %v, want lost still (e2, e3)", got)
	}
	// Asking again recovers nothing twice.
	if got, err := d.RecoverEndpoints("lost", []RecoveredEndpoint{{ID: e1, MAC: mac(11), Addrs: pfx("10.1.0.11/16")}}); len(got) != 0 || err != nil {
		t.Fatalf("second recovery: %v, %v", got, err)
	}

	// The next run knows e1 from the state database, joined.
	d.Close()
	d2 := newTestDriverWith(t, k, localVTEP, db, false)
	st = d2.State()
	if len(st) != 1 || len(st[0].Endpoints) != 1 || st[0].Endpoints[0].ID != e1 || !st[0].Endpoints[0].Joined {
		t.Fatalf("the next run's state: %+v", st)
	}
	// Docker's Leave of a recovered endpoint removes its veth, as any.
	must(t, d2.Leave(&api.LeaveRequest{NetworkID: "lost", EndpointID: e1}))
	if _, ok := k.Snapshot()["lost"].Veths[vethFor(e1, hwaddr.MAC{}, 0).SandboxName]; ok {
		t.Fatal("the recovered endpoint's veth stayed after its Leave")
	}
	if _, err := d2.RecoverEndpoints("nope", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown network: %v", err)
	}
}
