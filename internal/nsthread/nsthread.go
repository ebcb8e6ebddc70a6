// Package nsthread is the one place where this module moves an OS thread
// into another network namespace: to run code there (Do, and Open for a
// socket), to create a namespace (New), to name the current one (Current).
// A socket belongs to the namespace of the thread that opened it, for
// life, so the kernel-facing packages open their netlink sockets through
// Open, and the tests enter their throwaway namespaces through Do.
//
// The rules, which every function here keeps and which nothing else in the
// module may break by calling setns or unshare itself:
//
//   - A namespace is entered only by a fresh goroutine locked to its
//     thread (runtime.LockOSThread), so that nothing else runs there
//     meanwhile and the goroutine never moves to another thread.
//     Goroutines that f starts run on other threads, outside.
//   - The thread is put back into the namespace it came from before it is
//     unlocked. If that fails it stays locked: a goroutine that exits
//     locked takes its thread with it (the main thread is parked
//     instead), so a thread in the wrong namespace never runs another
//     goroutine. vishvananda/netlink's NewHandleAt unlocks whether or not
//     switching back worked, which is why Open runs its plain NewHandle.
package nsthread

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs f on a fresh goroutine locked to its OS thread inside ns, and
// returns f's error; f must not call t.FailNow (it runs on another
// goroutine). A closed handle (netns.None()) means the caller's namespace,
// as in vishvananda/netlink's ...At functions: f runs at once on the
// calling goroutine.
func Do(ns netns.NsHandle, f func() error) error {
	if !ns.IsOpen() {
		return f()
	}
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return nil
	}, f)
}

// Open returns what open, run inside ns as by Do, opened: a socket stays in
// the namespace it was opened in. Should Do fail after open succeeded (the
// thread could not switch back), the result is closed and the error
// returned.
func Open[T interface{ Close() }](ns netns.NsHandle, open func() (T, error)) (T, error) {
	var v T
	opened := false
	err := Do(ns, func() (err error) {
		v, err = open()
		opened = err == nil
		return err
	})
	if err != nil {
		if opened {
			v.Close()
		}
		var zero T
		return zero, err
	}
	return v, nil
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

// Current returns a handle to the network namespace of the calling
// goroutine: the process's, unless it runs inside Do.
func Current() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return netns.Get()
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
