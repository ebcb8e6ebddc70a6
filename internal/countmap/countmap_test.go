package countmap

import "testing"

func TestAddRemovesZero(t *testing.T) {
	m := Map[string]{}
	if got := m.Add("a", 1); got != 1 {
		t.Fatalf("Add(a,1) = %d, want 1", got)
	}
	if got := m.Add("a", 2); got != 3 {
		t.Fatalf("Add(a,2) = %d, want 3", got)
	}
	if got := m.Add("a", -3); got != 0 {
		t.Fatalf("Add(a,-3) = %d, want 0", got)
	}
	if _, ok := m["a"]; ok {
		t.Fatal("key with zero count still present")
	}
	if len(m) != 0 {
		t.Fatalf("len = %d, want 0", len(m))
	}
}

func TestAddNegativeIsReportedAndForgotten(t *testing.T) {
	m := Map[int]{}
	if got := m.Add(7, -1); got != -1 {
		t.Fatalf("Add(7,-1) = %d, want -1", got)
	}
	if len(m) != 0 {
		t.Fatalf("negative count kept: %v", m)
	}
}

func TestIndependentKeys(t *testing.T) {
	m := Map[[2]int]{}
	m.Add([2]int{1, 2}, 1)
	m.Add([2]int{2, 1}, 1)
	m.Add([2]int{1, 2}, -1)
	if len(m) != 1 || m[[2]int{2, 1}] != 1 {
		t.Fatalf("unexpected map %v", m)
	}
}
