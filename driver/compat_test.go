package driver

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/statedb"
)

// testdata/state-0.1.0.db was written by release 0.1.0 (b9efa67): three
// networks (plain 300, encrypted 301, idle 302), endpoints eplain and
// esecret (joined) and e2 (created) with endpointReq's addresses, and the
// public keys of generation 7 published for 198.51.100.1; made by a test at
// that commit that ran TestRestartResumes's first half and KeyStore.Save
// on a file. This release must open it and take every record over.
func TestStateDBOfPreviousReleaseOpens(t *testing.T) {
	src, err := os.ReadFile("testdata/state-0.1.0.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := statedb.Open(path, statedb.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("this release refuses 0.1.0's state database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	d := newTestDriverWith(t, fakekernel.New(), localVTEP, db, false)
	st := map[string]NetworkState{}
	for _, s := range d.State() {
		st[s.ID] = s
	}
	for id, vni := range map[string]uint32{"plain": 300, "secret": 301, "idle": 302} {
		if st[id].VNI != vni {
			t.Errorf("network %s: VNI %d, want %d (%+v)", id, st[id].VNI, vni, st[id])
		}
	}
	eps := map[string]EndpointState{}
	for _, n := range []string{"plain", "secret"} {
		for _, ep := range st[n].Endpoints {
			eps[ep.ID] = ep
		}
	}
	want := map[string]string{"eplain": "10.1.0.11/16", "esecret": "10.1.0.11/16", "e2": "10.1.0.12/16"}
	for id, addr := range want {
		ep, ok := eps[id]
		if !ok || len(ep.Addrs) == 0 || ep.Addrs[0] != netip.MustParsePrefix(addr) || ep.MAC.IsZero() {
			t.Errorf("endpoint %s: %+v, want address %s and its MAC", id, ep, addr)
		}
	}
	if len(eps) != len(want) {
		t.Errorf("endpoints %v, want %v", eps, want)
	}
	keys := encryption.KeyStore{DB: db}.Resume(netip.MustParseAddr("198.51.100.1"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(keys) != 1 || keys[0].Gen != 7 || len(keys[0].Key) != 32 || keys[0].Key[31] != 31 {
		t.Errorf("0.1.0's published keys: %+v", keys)
	}
}
