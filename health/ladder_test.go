package health

import (
	"slices"
	"testing"
)

func TestLadder(t *testing.T) {
	got := ladder(256, 1450)
	if len(got) != ladderSteps || got[0] != 256 || got[len(got)-1] != 1450 || !slices.IsSorted(got) {
		t.Fatalf("ladder(256, 1450) = %v", got)
	}
	if got := ladder(1000, 1003); !slices.Equal(got, []int{1000, 1001, 1002, 1003}) {
		t.Fatalf("a short range: %v", got)
	}
	if got := ladder(5, 4); got != nil {
		t.Fatalf("an empty range: %v", got)
	}
}

func TestNarrow(t *testing.T) {
	for _, c := range []struct {
		sizes    []int
		answered []bool
		best     int
		lo, hi   int
	}{
		{[]int{64, 256, 800, 1450}, []bool{true, true, true, false}, 800, 801, 1449},
		{[]int{64, 256, 800, 1450}, []bool{true, true, true, true}, 1450, 1, 0},
		{[]int{64, 256}, []bool{false, false}, 0, 1, 0},
		// A lost size below an answered one is loss, not the MTU.
		{[]int{64, 256, 800, 1450}, []bool{true, false, true, false}, 800, 801, 1449},
		{[]int{1340, 1341}, []bool{true, false}, 1340, 1341, 1340},
	} {
		best, lo, hi := narrow(c.sizes, c.answered)
		if best != c.best || (c.lo <= c.hi) != (lo <= hi) || (lo <= hi && (lo != c.lo || hi != c.hi)) {
			t.Errorf("narrow(%v, %v) = %d, [%d, %d]; want %d, [%d, %d]", c.sizes, c.answered, best, lo, hi, c.best, c.lo, c.hi)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	f.Add(appendMessage(nil, message{kind: kindProbe, size: 1450, seq: 7}, 100))
	f.Add([]byte("ovhc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		if err != nil {
			return
		}
		again, err := parseMessage(appendMessage(nil, m, 0))
		if err != nil || again != m {
			t.Fatalf("%+v did not survive a round trip: %+v, %v", m, again, err)
		}
	})
}
