package vni

import (
	"testing"
	"time"
)

// TestHoldWaitsForRecovery: an allocation during a Hold waits for the
// recovery, so it never takes a VNI the recovery then finds in use.
func TestHoldWaitsForRecovery(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	release := a.Hold(time.Minute)
	got := make(chan uint32, 1)
	go func() {
		v, err := a.Allocate("new")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	select {
	case v := <-got:
		t.Fatalf("Allocate returned %d during the hold", v)
	case <-time.After(50 * time.Millisecond):
	}
	if err := a.Recover("running", DefaultRange.Min); err != nil {
		t.Fatal(err)
	}
	if err := a.Recover("running", DefaultRange.Min+7); err != nil {
		t.Fatalf("Recover of a network the table knows: %v", err)
	}
	release()
	release()
	if v := <-got; v != DefaultRange.Min+1 {
		t.Fatalf("Allocate after recovery = %d, want %d", v, DefaultRange.Min+1)
	}
	if v, _ := a.Lookup("running"); v != DefaultRange.Min {
		t.Fatalf("recovered network holds %d, want %d: the table keeps its word", v, DefaultRange.Min)
	}
	if err := a.Recover("other", DefaultRange.Min); err == nil {
		t.Fatal("Recover gave a held VNI to a second network")
	}
}

// TestHoldBounded: an allocation waits at most the hold's bound, then
// fails with an error saying to retry.
func TestHoldBounded(t *testing.T) {
	a := newAlloc(t, DefaultRange)
	defer a.Hold(20 * time.Millisecond)()
	_, err := a.Allocate("new")
	wantErr(t, err, "being recovered", "retry")
	wantErr(t, a.Reserve("new", 300), "being recovered")
	if _, ok := a.Lookup("new"); ok {
		t.Fatal("a failed allocation recorded a VNI")
	}
}
