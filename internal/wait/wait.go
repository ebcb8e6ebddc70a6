// Package wait is the one poll loop of the tests: a condition checked
// again and again until it holds or a deadline passes. In-process tests
// (cluster, cmd, scale, where time may be synctest's virtual time) and
// the multi-host ones (internal/testbed and the suites on it) use it
// alike, so every bounded wait fails the same way: what was awaited, for
// how long, and the last reason it did not hold.
package wait

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Until calls check every `every` until it returns nil, and then returns
// nil. Once timeout has passed (measured from the call) it returns the
// last error, saying how long it waited. check runs at least once, and
// once more after the deadline has passed, so a slow check never loses
// its last chance.
func Until(timeout, every time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", timeout, err)
		}
		time.Sleep(every)
	}
}

// For is Until in a test: it fails tb (Fatal) with what and the error.
func For(tb testing.TB, timeout, every time.Duration, what string, check func() error) {
	tb.Helper()
	if err := Until(timeout, every, check); err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// ErrNotYet is what Bool's check returns while its condition is false.
var ErrNotYet = errors.New("condition not met yet")

// Bool turns a condition without a reason into a check.
func Bool(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return ErrNotYet
	}
}
