// Package nsthread is the one place where this module moves an OS thread
// into another network namespace: to run code there (Do), to create a
// namespace (New), to find the process's own (Current). A socket takes the
// namespace of the thread that opens it and keeps it for life, so opening
// sockets through Do is how the kernel-facing packages and the tests reach
// a namespace.
//
// The rules, which every function here keeps and nothing else in the module
// may break by calling setns or unshare itself:
//
//   - A namespace is entered only on a goroutine locked to its thread
//     (runtime.LockOSThread), so that nothing else runs there meanwhile and
//     the goroutine never moves to another thread. Goroutines that f
//     starts run on other threads, in the process's namespace.
//   - The thread is put back into the namespace it came from before it is
//     unlocked. If that fails it stays locked: a goroutine that exits
//     locked takes its thread with it, so a thread in the wrong namespace
//     never returns to the pool. (vishvananda/netlink's NewHandleAt unlocks
//     whether or not switching back worked, which is why this package opens
//     sockets in the current namespace instead.)
package nsthread

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs f on a fresh goroutine locked to its OS thread inside ns, and
// returns f's error. A closed handle (netns.None()) runs f in the
// namespace the thread started in, the process's. f must not call
// t.FailNow (it runs on another goroutine).
func Do(ns netns.NsHandle, f func() error) error {
	if !ns.IsOpen() {
		return onThread(func() error { return nil }, f)
	}
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return nil
	}, f)
}

// New creates a network namespace and returns a handle to it, which keeps
// it alive until closed (with whatever else holds it: a mount, a socket, a
// device's peer).
func New() (netns.NsHandle, error) {
	h := netns.None()
	err := onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("create network namespace: %w", err)
		}
		return nil
	}, func() (err error) {
		h, err = netns.Get()
		return err
	})
	if err != nil && h.IsOpen() {
		h.Close()
		h = netns.None()
	}
	return h, err
}

// Current returns a handle to the process's network namespace, the one
// every unlocked thread is in.
func Current() (netns.NsHandle, error) {
	h := netns.None()
	err := onThread(func() error { return nil }, func() (err error) {
		h, err = netns.Get()
		return err
	})
	return h, err
}

// Mount bind-mounts ns on path, an existing file, which then keeps the
// namespace alive (and names it) until unmounted.
func Mount(ns netns.NsHandle, path string) error {
	src := fmt.Sprintf("/proc/self/fd/%d", int(ns))
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount network namespace on %s: %w", path, err)
	}
	return nil
}

// onThread runs enter, then f if enter succeeded, on a new goroutine locked
// to its thread, and puts the thread back into its namespace; see the
// package doc for why it stays locked when that fails.
func onThread(enter, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread() // nothing switched yet
			errc <- fmt.Errorf("open the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = enter()
		if err == nil {
			err = f()
		}
		if rerr := netns.Set(orig); rerr != nil {
			// Still locked: the thread ends with this goroutine.
			errc <- errors.Join(err, fmt.Errorf("return to the original network namespace (thread discarded): %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
