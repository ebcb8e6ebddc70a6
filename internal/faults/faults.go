// Package faults is the fault injection and call counting that the
// in-memory fakes (kernel/fakekernel, servicelb/fakelb) share: a test
// tells a fake to fail any call, and asks how many calls it served.
package faults

import "sync"

// Injector consults a hook before each call of a fake and counts the calls
// that got past it. The zero value is ready to use; do not copy it.
type Injector[Op comparable] struct {
	// mu guards hook and calls. It is a leaf lock: the hook runs without
	// it (and may take the fake's locks).
	mu    sync.Mutex
	hook  func(op Op, target string) error
	calls map[Op]int
}

// Set installs hook, consulted before every call with the operation and
// its target (a sandbox, a namespace path); a non-nil error fails the call.
// nil removes it.
func (in *Injector[Op]) Set(hook func(op Op, target string) error) {
	in.mu.Lock()
	in.hook = hook
	in.mu.Unlock()
}

// Check consults the hook for op on target and returns its error; a call
// that gets past it is counted.
func (in *Injector[Op]) Check(op Op, target string) error {
	in.mu.Lock()
	hook := in.hook
	in.mu.Unlock()
	if hook != nil {
		if err := hook(op, target); err != nil {
			return err
		}
	}
	in.mu.Lock()
	if in.calls == nil {
		in.calls = map[Op]int{}
	}
	in.calls[op]++
	in.mu.Unlock()
	return nil
}

// Calls reports how many op calls got past the hook.
func (in *Injector[Op]) Calls(op Op) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[op]
}
