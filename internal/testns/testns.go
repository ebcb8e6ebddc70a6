// Package testns helps privileged tests run against the real kernel in
// throwaway network namespaces, never touching the namespace the test
// process started in.
//
// Namespaces are made and entered with internal/nsthread, whose rules keep
// every other goroutine of the test in the namespace it started in.
package testns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
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
		h, err := nsthread.New()
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

// New returns a handle to a fresh, unnamed network namespace (skipping t
// when that is not permitted). The handle is closed in t.Cleanup; the
// namespace disappears once nothing else (sockets, devices' peers,
// mounts) holds it.
func New(t testing.TB) netns.NsHandle {
	t.Helper()
	RequireRoot(t)
	h, err := nsthread.New()
	if err != nil {
		t.Fatalf("create network namespace: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Do runs f on a locked OS thread inside ns and returns its error (see
// nsthread.Do). f must not call t.FailNow (it runs on another goroutine),
// and goroutines it starts do not inherit ns. Sockets f opens stay in ns
// for their lifetime.
func Do(ns netns.NsHandle, f func() error) error { return nsthread.Do(ns, f) }

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
	if err := nsthread.Mount(ns, path); err != nil {
		os.Remove(path)
		t.Fatal(err)
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
