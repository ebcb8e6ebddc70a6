package wait

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestUntilReturnsOnceTheCheckHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start, calls := time.Now(), 0
		err := Until(time.Second, 10*time.Millisecond, func() error {
			calls++
			if calls < 5 {
				return errors.New("no")
			}
			return nil
		})
		if err != nil || calls != 5 || time.Since(start) != 40*time.Millisecond {
			t.Fatalf("err %v after %d calls and %v, want nil after 5 calls and 40ms", err, calls, time.Since(start))
		}
	})
}

func TestUntilGivesTheLastReasonAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		last := errors.New("still no")
		start := time.Now()
		err := Until(100*time.Millisecond, 30*time.Millisecond, func() error { return last })
		if !errors.Is(err, last) || !strings.Contains(err.Error(), "not within 100ms") {
			t.Fatalf("err %v, want the last reason and the bound", err)
		}
		// Checked at 0, 30, 60, 90 and, past the deadline, 120 ms.
		if took := time.Since(start); took != 120*time.Millisecond {
			t.Fatalf("gave up after %v, want 120ms", took)
		}
	})
}

func TestBool(t *testing.T) {
	if err := Bool(func() bool { return false })(); !errors.Is(err, ErrNotYet) {
		t.Fatalf("false: %v", err)
	}
	if err := Bool(func() bool { return true })(); err != nil {
		t.Fatalf("true: %v", err)
	}
}
