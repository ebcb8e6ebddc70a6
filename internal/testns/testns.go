// Package testns helps privileged tests run against the real kernel in
// throwaway network namespaces, never touching the namespace the test
// process started in.
//
// Namespace switches happen only on dedicated goroutines locked to their OS
// thread; a thread whose namespace could not be restored is never unlocked,
// so the Go runtime destroys it instead of reusing it.
package testns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

var (
	probeOnce sync.Once
	probeErr  error // why privileged tests cannot run; nil if they can
)

// RequireRoot skips t, saying why, unless the process is root and may
// create network namespaces.
func RequireRoot(t testing.TB) {
	t.Helper()
	probeOnce.Do(func() {
		if euid := os.Geteuid(); euid != 0 {
			probeErr = fmt.Errorf("not running as root (euid %d)", euid)
			return
		}
		h, err := create()
		if err != nil {
			probeErr = fmt.Errorf("cannot create a network namespace: %w", err)
			return
		}
		h.Close()
	})
	if probeErr != nil {
		t.Skipf("privileged test skipped: %v", probeErr)
	}
}

// create makes an unnamed network namespace on a thread that is discarded
// afterwards, and returns a handle to it.
func create() (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: this thread now lives in the new namespace and
		// must die with the goroutine.
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{netns.None(), fmt.Errorf("unshare: %w", err)}
			return
		}
		h, err := netns.Get()
		ch <- result{h, err}
	}()
	r := <-ch
	return r.h, r.err
}

// New returns a handle to a fresh, unnamed network namespace (skipping t
// when that is not permitted). The handle is closed in t.Cleanup; the
// namespace disappears once nothing else (sockets, devices' peers,
// mounts) holds it.
func New(t testing.TB) netns.NsHandle {
	t.Helper()
	RequireRoot(t)
	h, err := create()
	if err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Do runs f on a locked OS thread inside ns and returns its error. f must
// not call t.FailNow (it runs on another goroutine), and goroutines it
// starts do not inherit ns. Sockets f opens stay in ns for their lifetime.
func Do(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("testns: get current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("testns: enter namespace: %w", err)
			return // may be half-switched: leave locked, thread is discarded
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked so the runtime discards it.
			errc <- errors.Join(ferr, fmt.Errorf("testns: return to original namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Mount bind-mounts ns on path (created as an empty file, whose directory
// must exist), the way Docker publishes a container's namespace as its
// SandboxKey, and undoes it in t.Cleanup. The mount lives in the test
// process's mount namespace, so choose a path in a directory of the
// test's own.
func Mount(t testing.TB, ns netns.NsHandle, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		t.Fatalf("create namespace mount point: %v", err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/self/fd/%d", int(ns))
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		t.Fatalf("bind-mount namespace on %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", path, err)
		}
		os.Remove(path)
	})
}

// Publish mounts ns (see Mount) on a file in a new temporary directory
// named after pattern (as os.MkdirTemp), and returns the file's path; the
// directory, where a test may put other files, goes in t.Cleanup.
func Publish(t testing.TB, ns netns.NsHandle, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "netns")
	Mount(t, ns, path)
	return path
}

// AddAddr adds prefix (an address with its prefix length, like
// "203.0.113.1/24") to link l through h; an IPv6 one without duplicate
// address detection, so that it is usable at once.
func AddAddr(t testing.TB, h *netlink.Handle, l netlink.Link, prefix string) {
	t.Helper()
	p := netip.MustParsePrefix(prefix)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", prefix, l.Attrs().Name, err)
	}
}

// SetUp brings link name up through h and returns it.
func SetUp(t testing.TB, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up: %v", name, err)
	}
	return l
}
