package netlinkutil

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestDumpRetriesInterruptedOnly(t *testing.T) {
	calls := 0
	got, err := Dump(func() (int, error) {
		calls++
		if calls < 3 {
			return -1, fmt.Errorf("list: %w", netlink.ErrDumpInterrupted)
		}
		return 42, nil
	})
	if err != nil || got != 42 || calls != 3 {
		t.Fatalf("Dump = %d, %v after %d calls; want 42, nil after 3", got, err, calls)
	}

	calls = 0
	other := errors.New("permission denied")
	if _, err := Dump(func() (int, error) { calls++; return 0, other }); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("another error: %v after %d calls; want it at once", err, calls)
	}

	calls = 0
	got, err = Dump(func() (int, error) { calls++; return 7, netlink.ErrDumpInterrupted })
	if !errors.Is(err, netlink.ErrDumpInterrupted) || got != 0 || calls != dumpRetries {
		t.Fatalf("always interrupted: %d, %v after %d calls; want the error and no partial result after %d", got, err, calls, dumpRetries)
	}
}
