package vni

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/bbolt"
)

func openDB(t *testing.T, path string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatalf("bbolt.Open: %v", err)
	}
	return db
}

func newAlloc(t *testing.T, r Range) *Allocator {
	t.Helper()
	db := openDB(t, filepath.Join(t.TempDir(), "vni.db"))
	t.Cleanup(func() { db.Close() })
	a, err := Open(db, r)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return a
}

func mustAllocate(t *testing.T, a *Allocator, id string) uint32 {
	t.Helper()
	v, err := a.Allocate(id)
	if err != nil {
		t.Fatalf("Allocate(%q): %v", id, err)
	}
	return v
}

func wantErr(t *testing.T, err error, substrs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want one containing %q", substrs)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestOpenRejectsBadRange(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "vni.db"))
	defer db.Close()
	for _, r := range []Range{{0, 10}, {10, 9}, {4000, 4096}, {5000, 6000}} {
		if _, err := Open(db, r); err == nil {
			t.Errorf("Open(%v) succeeded", r)
		}
	}
	if _, err := Open(nil, DefaultRange); err == nil {
		t.Error("Open(nil) succeeded")
	}
}

func TestAllocateLowestFree(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	for i, id := range []string{"n0", "n1", "n2"} {
		if got, want := mustAllocate(t, a, id), DefaultRange.Min+uint32(i); got != want {
			t.Errorf("Allocate(%s) = %d, want %d", id, got, want)
		}
	}
	// A reservation inside the range is skipped over.
	if err := a.Reserve("r", 259); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, a, "n3"); got != 260 {
		t.Errorf("Allocate after reserving 259 = %d, want 260", got)
	}
	// A reservation below the range does not disturb it.
	if err := a.Reserve("low", 5); err != nil {
		t.Fatal(err)
	}
	// The hole left by a release is filled first.
	if err := a.Release("n1"); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, a, "n4"); got != 257 {
		t.Errorf("Allocate after releasing 257 = %d, want 257", got)
	}
	if got := mustAllocate(t, a, "n5"); got != 261 {
		t.Errorf("Allocate = %d, want 261", got)
	}
}

func TestAllocateIdempotent(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	v := mustAllocate(t, a, "net")
	for range 3 {
		if got := mustAllocate(t, a, "net"); got != v {
			t.Fatalf("second Allocate = %d, want %d", got, v)
		}
	}
	if got := mustAllocate(t, a, "other"); got != v+1 {
		t.Errorf("Allocate(other) = %d, want %d", got, v+1)
	}
	// A network with an explicit VNI gets that VNI back from Allocate.
	if err := a.Reserve("explicit", 42); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, a, "explicit"); got != 42 {
		t.Errorf("Allocate(explicit) = %d, want 42", got)
	}
}

func TestReserve(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	if err := a.Reserve("a", 100); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a new leader re-reserves what was returned before.
	if err := a.Reserve("a", 100); err != nil {
		t.Errorf("re-Reserve same VNI: %v", err)
	}
	if v, ok := a.Lookup("a"); !ok || v != 100 {
		t.Errorf("Lookup(a) = %d, %v", v, ok)
	}
	// Taken by another network: the error names it.
	wantErr(t, a.Reserve("b", 100), "100", "network a")
	if _, ok := a.Lookup("b"); ok {
		t.Error("failed Reserve recorded b")
	}
	// The network already holds a different VNI.
	wantErr(t, a.Reserve("a", 101), "network a", "100", "101")
	if v, _ := a.Lookup("a"); v != 100 {
		t.Errorf("Lookup(a) = %d after conflicting Reserve", v)
	}
	// The failed Reserve did not take 101.
	if err := a.Reserve("c", 101); err != nil {
		t.Errorf("Reserve(c, 101): %v", err)
	}
	// Re-reserving an automatically allocated VNI is idempotent too.
	v := mustAllocate(t, a, "auto")
	if err := a.Reserve("auto", v); err != nil {
		t.Errorf("Reserve(auto, %d): %v", v, err)
	}
	// Bounds of UserRange are accepted.
	if err := a.Reserve("min", 1); err != nil {
		t.Error(err)
	}
	if err := a.Reserve("max", 4095); err != nil {
		t.Error(err)
	}
}

func TestReserveOutOfRange(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	for _, v := range []uint32{0, 4096, 1 << 24, 1<<32 - 1} {
		err := a.Reserve("n", v)
		wantErr(t, err, fmt.Sprint(v), "1-4095")
		if v >= 4096 && !strings.Contains(err.Error(), "4096 upward") {
			t.Errorf("error %q does not say why", err)
		}
	}
	if _, ok := a.Lookup("n"); ok {
		t.Error("out-of-range Reserve recorded the network")
	}
}

func TestEmptyNetworkID(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	wantErr(t, a.Reserve("", 10), "network id")
	_, err := a.Allocate("")
	wantErr(t, err, "network id")
	wantErr(t, a.Release(""), "network id")
	if _, ok := a.Lookup(""); ok {
		t.Error("Lookup(\"\") found something")
	}
}

func TestReleaseThenReuse(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	v := mustAllocate(t, a, "a")
	if err := a.Release("a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup("a"); ok {
		t.Error("Lookup after Release found a")
	}
	// Repeated and unknown releases are fine.
	if err := a.Release("a"); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if err := a.Release("never-seen"); err != nil {
		t.Errorf("Release(unknown): %v", err)
	}
	if got := mustAllocate(t, a, "b"); got != v {
		t.Errorf("Allocate(b) = %d, want reused %d", got, v)
	}
	// A released explicit VNI may be taken by another network.
	if err := a.Reserve("x", 7); err != nil {
		t.Fatal(err)
	}
	if err := a.Release("x"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve("y", 7); err != nil {
		t.Errorf("Reserve of released VNI: %v", err)
	}
	// And a released network may take a different VNI.
	if err := a.Reserve("x", 8); err != nil {
		t.Errorf("Reserve(x, 8) after release: %v", err)
	}
}

func TestPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vni.db")
	db := openDB(t, path)
	a, err := Open(db, DefaultRange)
	if err != nil {
		t.Fatal(err)
	}
	v1 := mustAllocate(t, a, "one")
	v2 := mustAllocate(t, a, "two")
	if err := a.Reserve("three", 77); err != nil {
		t.Fatal(err)
	}
	if err := a.Release("one"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = openDB(t, path)
	defer db.Close()
	a, err = Open(db, DefaultRange)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup("one"); ok {
		t.Error("released network survived reopen")
	}
	if v, ok := a.Lookup("two"); !ok || v != v2 {
		t.Errorf("Lookup(two) = %d, %v; want %d", v, ok, v2)
	}
	if v, ok := a.Lookup("three"); !ok || v != 77 {
		t.Errorf("Lookup(three) = %d, %v; want 77", v, ok)
	}
	if err := a.Reserve("two", v2); err != nil {
		t.Errorf("re-Reserve after reopen: %v", err)
	}
	wantErr(t, a.Reserve("four", 77), "network three")
	if got := mustAllocate(t, a, "four"); got != v1 {
		t.Errorf("Allocate after reopen = %d, want freed %d", got, v1)
	}
	if got := mustAllocate(t, a, "five"); got != v2+1 {
		t.Errorf("Allocate after reopen = %d, want %d", got, v2+1)
	}
}

func TestExhaustion(t *testing.T) {
	r := Range{Min: 10, Max: 12}
	a := newAlloc(t, r)
	// One VNI of the range taken by reservation.
	if err := a.Reserve("r", 11); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, a, "a"); got != 10 {
		t.Errorf("Allocate(a) = %d", got)
	}
	if got := mustAllocate(t, a, "b"); got != 12 {
		t.Errorf("Allocate(b) = %d", got)
	}
	_, err := a.Allocate("c")
	wantErr(t, err, "no free VNI", "10-12")
	if _, ok := a.Lookup("c"); ok {
		t.Error("failed Allocate recorded c")
	}
	// Existing networks still get theirs.
	if got := mustAllocate(t, a, "a"); got != 10 {
		t.Errorf("Allocate(a) when full = %d", got)
	}
	if err := a.Release("b"); err != nil {
		t.Fatal(err)
	}
	if got := mustAllocate(t, a, "c"); got != 12 {
		t.Errorf("Allocate(c) after release = %d, want 12", got)
	}
	// A VNI just above the range (taken by reservation) is not handed out.
	if err := a.Reserve("above", 13); err != nil {
		t.Fatal(err)
	}
	_, err = a.Allocate("d")
	wantErr(t, err, "no free VNI")

	// A single-VNI range.
	one := newAlloc(t, Range{Min: 4095, Max: 4095})
	if got := mustAllocate(t, one, "a"); got != 4095 {
		t.Errorf("Allocate = %d, want 4095", got)
	}
	_, err = one.Allocate("b")
	wantErr(t, err, "no free VNI")
}

func TestConcurrentAllocate(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	const n = 50
	got := make([]uint32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = a.Allocate(fmt.Sprintf("net-%02d", i)) })
	}
	wg.Wait()
	seen := map[uint32]int{}
	for i, v := range got {
		if errs[i] != nil {
			t.Fatalf("Allocate(net-%02d): %v", i, errs[i])
		}
		if j, dup := seen[v]; dup {
			t.Errorf("net-%02d and net-%02d both got VNI %d", j, i, v)
		}
		seen[v] = i
		if !DefaultRange.contains(v) {
			t.Errorf("VNI %d outside the range", v)
		}
		if l, ok := a.Lookup(fmt.Sprintf("net-%02d", i)); !ok || l != v {
			t.Errorf("Lookup(net-%02d) = %d, %v; want %d", i, l, ok, v)
		}
	}
	// Lowest-free means the n VNIs are exactly the first n of the range.
	for v := DefaultRange.Min; v < DefaultRange.Min+n; v++ {
		if _, ok := seen[v]; !ok {
			t.Errorf("VNI %d not handed out", v)
		}
	}
}
