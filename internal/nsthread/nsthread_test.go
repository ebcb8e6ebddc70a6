package nsthread_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// requireRoot skips t unless namespaces can be made here. (testns builds
// on this package, so the tests here cannot use it.)
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("privileged test skipped: not running as root")
	}
}

func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	h, err := nsthread.New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// nsID names the namespace get opens: netns.Get, the calling thread's
// (locked inside Do), or nsthread.Current.
func nsID(get func() (netns.NsHandle, error)) (string, error) {
	h, err := get()
	if err != nil {
		return "", err
	}
	defer h.Close()
	return h.UniqueId(), nil
}

// inside reports the namespace Do(ns) runs in.
func inside(ns netns.NsHandle) (id string, err error) {
	err = nsthread.Do(ns, func() (err error) {
		id, err = nsID(netns.Get)
		return err
	})
	return id, err
}

func mustInside(t *testing.T, ns netns.NsHandle) string {
	t.Helper()
	id, err := inside(ns)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	return id
}

func current(t *testing.T) string {
	t.Helper()
	id, err := nsID(nsthread.Current)
	if err != nil {
		t.Fatalf("Current: %v", err)
	}
	return id
}

func TestNewDoCurrent(t *testing.T) {
	requireRoot(t)
	home := current(t)
	a, b := newNS(t), newNS(t)
	if a.UniqueId() == home || a.Equal(b) {
		t.Fatalf("New returned the process's namespace or the same one twice: %s, %s (home %s)", a.UniqueId(), b.UniqueId(), home)
	}
	if got := mustInside(t, a); got != a.UniqueId() {
		t.Errorf("Do(a) ran in %s, want %s", got, a.UniqueId())
	}
	if got := mustInside(t, netns.None()); got != home {
		t.Errorf("Do(None) ran in %s, want the caller's %s", got, home)
	}
	if got := current(t); got != home {
		t.Errorf("after Do, Current is %s, want %s", got, home)
	}
	sentinel := errors.New("from f")
	if err := nsthread.Do(a, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do returned %v, want f's error", err)
	}
}

// Inside Do, Current and Do(None) mean the namespace Do entered.
func TestCallerNamespaceInsideDo(t *testing.T) {
	requireRoot(t)
	a := newNS(t)
	var cur, none string
	err := nsthread.Do(a, func() (err error) {
		if cur, err = nsID(nsthread.Current); err != nil {
			return err
		}
		none, err = inside(netns.None())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if cur != a.UniqueId() || none != a.UniqueId() {
		t.Fatalf("inside Do(a): Current is %s, Do(None) ran in %s; want %s", cur, none, a.UniqueId())
	}
}

// Nested calls each get a thread of their own: the inner one runs in its
// namespace, and the outer one is still in its own afterwards.
func TestNestedDo(t *testing.T) {
	requireRoot(t)
	a, b := newNS(t), newNS(t)
	var inner, after string
	err := nsthread.Do(a, func() (err error) {
		if inner, err = inside(b); err != nil {
			return err
		}
		after, err = nsID(netns.Get)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inner != b.UniqueId() || after != a.UniqueId() {
		t.Fatalf("inner ran in %s (want %s); the outer was in %s after it (want %s)", inner, b.UniqueId(), after, a.UniqueId())
	}
}

// A socket Open makes is in ns, and stays there after the thread left.
func TestOpen(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	h, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_ROUTE) })
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("the handle sees %d links (%v); want the new namespace's lo alone", len(links), links)
	}
	sentinel := errors.New("from open")
	if _, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return nil, sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("Open returned %v, want open's error", err)
	}
}

func TestDoNotANamespace(t *testing.T) {
	requireRoot(t)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ran := false
	err = nsthread.Do(netns.NsHandle(f.Fd()), func() error { ran = true; return nil })
	if err == nil || ran {
		t.Fatalf("Do into /dev/null: err %v, f ran %v; want an error and f not run", err, ran)
	}
}

func TestMount(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := nsthread.Mount(ns, path); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(path, unix.MNT_DETACH)
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !h.Equal(ns) {
		t.Fatalf("%s holds %s, want %s", path, h.UniqueId(), ns.UniqueId())
	}
}

// TestThreadThatCannotReturnIsDiscarded: f drops CAP_SYS_ADMIN from its
// thread (capabilities are per thread), so switching back fails. Do must
// report it and the thread must end, never to run another goroutine in the
// foreign namespace with the capability gone: later calls all work.
func TestThreadThatCannotReturnIsDiscarded(t *testing.T) {
	requireRoot(t)
	ns := newNS(t)
	seen := false
	for range 10 {
		tid := 0
		err := nsthread.Do(ns, func() error {
			tid = unix.Gettid()
			return dropSysAdmin()
		})
		if tid == 0 || err == nil || !strings.Contains(err.Error(), "thread discarded") {
			t.Fatalf("Do with a thread that cannot return: f ran on thread %d, err %v; want it run and the failure reported", tid, err)
		}
		if tid == os.Getpid() {
			// The runtime parks the main thread instead of ending
			// it: nothing to observe; try again on another thread.
			continue
		}
		waitGone(t, tid)
		seen = true
		break
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if got, err := inside(ns); err != nil || got != ns.UniqueId() {
				t.Errorf("a later Do ran in %q (%v), want %s", got, err, ns.UniqueId())
			}
		})
	}
	wg.Wait()
	if !seen {
		t.Log("f ran on the main thread every time: only later calls were checked")
	}
}

// waitGone fails t unless thread tid of this process ends within 10 s.
func waitGone(t *testing.T, tid int) {
	t.Helper()
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d, stuck in a foreign namespace, still exists", tid)
		}
	}
}

// dropSysAdmin clears CAP_SYS_ADMIN from the calling thread's effective set.
func dropSysAdmin() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[unix.CAP_SYS_ADMIN/32].Effective &^= 1 << (unix.CAP_SYS_ADMIN % 32)
	return unix.Capset(&hdr, &data[0])
}
