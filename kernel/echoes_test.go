package kernel_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// TestWatchDropsOwnEchoes: what Program changes is not reported back, and
// an outside change of the same entries is, whichever came first in the
// kernel, and also after a request whose echo never came (a no-op).
func TestWatchDropsOwnEchoes(t *testing.T) {
	hst := newHost(t)
	const sb = "echo"
	must(t, hst.k.CreateSandbox(spec(sb, 304, "198.51.100.1")))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := hst.k.Watch(ctx, sb)
	must(t, err)
	v1 := netip.MustParseAddr("198.51.100.2")
	mac := func(i int) hwaddr.MAC { return hwaddr.MAC{0x02, 0x42, 0, 0, 0, byte(i)} }
	fdb := func(i int) kernel.FDBEntry { return kernel.FDBEntry{MAC: mac(i), VTEP: v1} }
	program := func(ops ...kernel.EntryOp) {
		t.Helper()
		for i, err := range hst.k.Program(sb, ops) {
			if err != nil {
				t.Fatalf("%v: %v", ops[i], err)
			}
		}
	}
	add := func(i int) kernel.EntryOp { return kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: fdb(i)} }
	outside := func(args ...string) { t.Helper(); hst.inSandbox(t, sb, args...) }
	// events returns the entry events the watch reports until an outside
	// marker entry (device events are not at issue here).
	marker := 100
	events := func() []kernel.Event {
		t.Helper()
		marker++
		m := mac(marker)
		outside("bridge", "fdb", "add", m.String(), "dev", kernel.VXLANName, "dst", "198.51.100.9", "self", "permanent")
		var got []kernel.Event
		timeout := time.After(5 * time.Second)
		for {
			select {
			case e := <-ch:
				if e.Kind == kernel.EventFDB && e.FDB.MAC == m {
					return got
				}
				if e.Kind == kernel.EventFDB || e.Kind == kernel.EventNeighbor {
					got = append(got, e)
				}
			case <-timeout:
				t.Fatalf("no marker event; got %v", got)
			}
		}
	}
	has := func(evs []kernel.Event, want kernel.Event) bool {
		for _, e := range evs {
			if e == want {
				return true
			}
		}
		return false
	}
	fdbEvent := func(e kernel.FDBEntry, deleted bool) kernel.Event {
		return kernel.Event{Kind: kernel.EventFDB, FDB: e, Deleted: deleted}
	}
	static := func(e kernel.FDBEntry) kernel.FDBEntry { e.NotPermanent = true; return e }
	ip := netip.MustParseAddr("10.0.0.1")

	// Ours, then outside changes of the same entries.
	program(kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: mac(1)}},
		add(1), kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{VTEP: v1}})
	if evs := events(); len(evs) != 0 {
		t.Errorf("Program's own changes were reported: %v", evs)
	}
	program(add(2), add(3))
	outside("bridge", "fdb", "replace", mac(2).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self", "static")
	outside("bridge", "fdb", "del", mac(3).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self")
	outside("ip", "neigh", "replace", ip.String(), "lladdr", mac(1).String(), "dev", kernel.VXLANName, "nud", "noarp")
	evs := events()
	for _, want := range []kernel.Event{fdbEvent(static(fdb(2)), false), fdbEvent(fdb(3), true),
		{Kind: kernel.EventNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: mac(1), NotPermanent: true}}} {
		if !has(evs, want) {
			t.Errorf("outside change after ours not reported: %+v; got %v", want, evs)
		}
	}
	if has(evs, fdbEvent(fdb(2), false)) || has(evs, fdbEvent(fdb(3), false)) {
		t.Errorf("our echoes reported: %v", evs)
	}

	// Outside first, then ours.
	outside("bridge", "fdb", "add", mac(4).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self", "static")
	program(add(4))
	if evs := events(); !has(evs, fdbEvent(static(fdb(4)), false)) {
		t.Errorf("outside change before ours not reported: %v", evs)
	}

	// A no-op request leaves a record its echo never consumes; our delete
	// replaces it, so the entry made again from outside is reported.
	// (Requests of different outcome for one entry in flight together
	// may be reported, which is safe; events() waits for each echo.)
	program(add(5))
	program(add(5)) // no change: no echo
	if evs := events(); len(evs) != 0 {
		t.Errorf("Program's own changes were reported: %v", evs)
	}
	program(kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: fdb(5)})
	if evs := events(); len(evs) != 0 {
		t.Errorf("Program's own changes were reported: %v", evs)
	}
	outside("bridge", "fdb", "add", mac(5).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self", "permanent")
	if evs := events(); !has(evs, fdbEvent(fdb(5), false)) {
		t.Errorf("outside add after our delete not reported: %v", evs)
	}

	// A request the kernel refused (a delete of a missing entry, which
	// Program reports as done) leaves no record.
	program(kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: fdb(6)})
	outside("bridge", "fdb", "add", mac(6).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self", "permanent")
	outside("bridge", "fdb", "del", mac(6).String(), "dev", kernel.VXLANName, "dst", v1.String(), "self")
	if evs := events(); !has(evs, fdbEvent(fdb(6), true)) {
		t.Errorf("outside delete after our failed one not reported: %v", evs)
	}
}

// TestWatchEchoRace: Program and an outside `bridge -batch` change the
// same entries at once (ours permanent, theirs static). Wherever the
// outside change was the last, the last event reported for the entry
// must be it: our echo never hides it.
func TestWatchEchoRace(t *testing.T) {
	hst := newHost(t)
	const sb = "race"
	must(t, hst.k.CreateSandbox(spec(sb, 305, "198.51.100.1")))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := hst.k.Watch(ctx, sb)
	must(t, err)
	v1 := netip.MustParseAddr("198.51.100.2")
	const n = 300
	var ops []kernel.EntryOp
	var batch strings.Builder
	for i := range n {
		m := hwaddr.MAC{0x02, 0x42, 0, 0, byte(i >> 8), byte(i)}
		ops = append(ops, kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: m, VTEP: v1}})
		fmt.Fprintf(&batch, "fdb replace %s dev %s dst %s self static\n", m, kernel.VXLANName, v1)
	}
	file := filepath.Join(t.TempDir(), "batch")
	must(t, os.WriteFile(file, []byte(batch.String()), 0o644))
	var wg sync.WaitGroup
	wg.Go(func() { hst.inSandbox(t, sb, "bridge", "-batch", file) })
	for range 3 {
		if errs := hst.k.Program(sb, ops); errs != nil {
			t.Fatal(errors.Join(errs...))
		}
	}
	wg.Wait()
	marker := hwaddr.MAC{0x02, 0x42, 0xff, 0, 0, 1}
	hst.inSandbox(t, sb, "bridge", "fdb", "add", marker.String(), "dev", kernel.VXLANName, "dst", v1.String(), "self", "permanent")
	last := map[hwaddr.MAC]kernel.Event{}
	timeout := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case e := <-ch:
			switch {
			case e.Kind == kernel.EventLost:
				t.Skip("the watch lost events; nothing to compare")
			case e.Kind != kernel.EventFDB:
			case e.FDB.MAC == marker:
				done = true
			default:
				last[e.FDB.MAC] = e
			}
		case <-timeout:
			t.Fatal("no marker event")
		}
	}
	fdb, err := hst.k.FDB(sb)
	must(t, err)
	outsideLast := 0
	for _, e := range fdb {
		if !e.NotPermanent {
			continue
		}
		outsideLast++
		if got := last[e.MAC]; got.Deleted || !got.FDB.NotPermanent {
			t.Errorf("%s: static from outside last, but the last event reported was %+v", e.MAC, got)
		}
	}
	t.Logf("%d of %d entries were static from outside last", outsideLast, n)
}
