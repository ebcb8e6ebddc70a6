package kernel_test

// Privileged tests of what the reconciler relies on: entries made by
// others are seen (NOARP included), broken devices are rebuilt inside the
// sandbox, and changes are reported as events.

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
)

// inSandbox runs an iproute2 command in a sandbox, as an operator would.
func (hst *host) inSandbox(t *testing.T, sandbox string, args ...string) {
	t.Helper()
	cmd := append([]string{"--net=" + filepath.Join(hst.dir, sandbox)}, args...)
	if out, err := exec.Command("nsenter", cmd...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestEntriesMadeByOthersAreListed(t *testing.T) {
	hst := newHost(t)
	must(t, hst.k.CreateSandbox(spec("sb", 300, "198.51.100.1")))
	mac := mustMAC("02:42:0a:00:00:02")
	kerneltest.Program(t, hst.k, "sb", kerneltest.SetNeighbor(netip.MustParseAddr("203.0.113.2"), mac),
		kerneltest.AddFDB(mac, netip.MustParseAddr("198.51.100.2")))
	hst.inSandbox(t, "sb", "ip", "neigh", "replace", "203.0.113.9", "lladdr", "02:42:0a:00:00:09", "dev", kernel.VXLANName, "nud", "noarp")
	hst.inSandbox(t, "sb", "bridge", "fdb", "add", "02:42:0a:00:00:09", "dev", kernel.VXLANName, "dst", "198.51.100.9", "self", "static")
	hst.inSandbox(t, "sb", "bridge", "fdb", "add", "02:42:0a:00:00:08", "dev", kernel.VXLANName, "dst", "198.51.100.8", "self", "permanent")

	ns, err := hst.k.Neighbors("sb")
	must(t, err)
	wantN := []kernel.Neighbor{{IP: netip.MustParseAddr("203.0.113.2"), MAC: mac},
		{IP: netip.MustParseAddr("203.0.113.9"), MAC: mustMAC("02:42:0a:00:00:09"), NotPermanent: true}}
	slices.SortFunc(ns, func(a, b kernel.Neighbor) int { return a.IP.Compare(b.IP) })
	if !slices.Equal(ns, wantN) {
		t.Errorf("Neighbors = %+v, want %+v", ns, wantN)
	}
	fdb, err := hst.k.FDB("sb")
	must(t, err)
	wantF := []kernel.FDBEntry{{MAC: mac, VTEP: netip.MustParseAddr("198.51.100.2")},
		{MAC: mustMAC("02:42:0a:00:00:08"), VTEP: netip.MustParseAddr("198.51.100.8")},
		{MAC: mustMAC("02:42:0a:00:00:09"), VTEP: netip.MustParseAddr("198.51.100.9"), NotPermanent: true}}
	slices.SortFunc(fdb, func(a, b kernel.FDBEntry) int { return a.VTEP.Compare(b.VTEP) })
	if !slices.Equal(fdb, wantF) {
		t.Errorf("FDB = %+v, want %+v", fdb, wantF)
	}
	// A NOARP entry can be deleted like ours.
	kerneltest.Program(t, hst.k, "sb", kerneltest.DeleteFDB(mustMAC("02:42:0a:00:00:09"), netip.MustParseAddr("198.51.100.9")),
		kerneltest.DeleteNeighbor(netip.MustParseAddr("203.0.113.9")))
	kerneltest.MustEntries(t, hst.k, "sb", wantN[:1], wantF[:2])
}

func TestRepairSandbox(t *testing.T) {
	hst := newHost(t)
	sp := spec("sb", 301, "198.51.100.1")
	must(t, hst.k.CreateSandbox(sp))
	must(t, hst.k.AddVeth("sb", kernel.Veth{HostName: "ovhr1", SandboxName: "ovsr1", MAC: mustMAC("02:42:00:00:00:01"), MTU: 1450}))
	_, sh := hst.sandboxNS(t, "sb")
	nb := kernel.Neighbor{IP: netip.MustParseAddr("203.0.113.2"), MAC: mustMAC("02:42:0a:00:00:02")}
	setNb := kerneltest.SetNeighbor(nb.IP, nb.MAC)
	kerneltest.Program(t, hst.k, "sb", setNb) // caches vxlan0's ifindex

	repair := func(want ...kernel.Repair) {
		t.Helper()
		got, err := hst.k.RepairSandbox(sp)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("RepairSandbox = %+v, %v; want %+v", got, err, want)
		}
		br, err := sh.LinkByName(kernel.BridgeName)
		must(t, err)
		for _, name := range []string{kernel.VXLANName, "ovsr1"} {
			l, err := sh.LinkByName(name)
			if err != nil || l.Attrs().MasterIndex != br.Attrs().Index || !linkUp(l) || !linkUp(br) {
				t.Fatalf("after repair %s: %v, master %d (bridge %d)", name, err, l.Attrs().MasterIndex, br.Attrs().Index)
			}
		}
	}
	repair() // nothing wrong

	del := func(name string) {
		t.Helper()
		l, err := sh.LinkByName(name)
		must(t, err)
		must(t, sh.LinkDel(l))
	}
	del(kernel.VXLANName)
	if _, err := hst.k.Neighbors("sb"); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("Neighbors without %s: %v, want not found (not an empty list)", kernel.VXLANName, err)
	}
	repair(kernel.Repair{Device: kernel.VXLANName, Problem: "missing", Rebuilt: true})
	kerneltest.Program(t, hst.k, "sb", setNb) // with the new device's ifindex

	del(kernel.BridgeName)
	repair(kernel.Repair{Device: kernel.BridgeName, Problem: "missing", Rebuilt: true},
		kernel.Repair{Device: "ovsr1", Problem: "not on the bridge"},
		kernel.Repair{Device: kernel.VXLANName, Problem: "not on the bridge"})

	vx, err := sh.LinkByName(kernel.VXLANName)
	must(t, err)
	must(t, sh.LinkSetDown(vx))
	repair(kernel.Repair{Device: kernel.VXLANName, Problem: "down"})

	// A vxlan0 made by someone else, with another VNI.
	del(kernel.VXLANName)
	hst.inSandbox(t, "sb", "ip", "link", "add", kernel.VXLANName, "type", "vxlan", "id", "999", "dstport", "4789", "nolearning")
	repair(kernel.Repair{Device: kernel.VXLANName, Problem: "VNI 999, not 301", Rebuilt: true})
	ns, err := hst.k.Neighbors("sb")
	if err != nil || len(ns) != 0 {
		t.Fatalf("a rebuilt device is empty: %v, %v", ns, err)
	}
	hst.assertSandboxes(t, "sb")
}

// A sandbox whose devices are gone is still there (the reconciler rebuilds
// them); only a dead namespace is not found.
func TestInspectDeadOrBroken(t *testing.T) {
	hst := newHost(t)
	must(t, hst.k.CreateSandbox(spec("sb", 302, "198.51.100.1")))
	hst.inSandbox(t, "sb", "ip", "link", "del", kernel.VXLANName)
	info, err := hst.k.Inspect("sb")
	if err != nil || info.Spec.VNI != 0 || info.Spec.MTU == 0 {
		t.Fatalf("Inspect of a sandbox without %s: %+v, %v", kernel.VXLANName, info, err)
	}
	if _, err := hst.k.Inspect("nope"); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("Inspect of a missing sandbox: %v", err)
	}
	// A mount point left without its namespace, as a previous run's
	// mount namespace leaves it.
	must(t, unix.Unmount(filepath.Join(hst.dir, "sb"), unix.MNT_DETACH))
	if _, err := hst.k.Inspect("sb"); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("Inspect of a dead mount: %v", err)
	}
	if _, err := hst.k.RepairSandbox(spec("sb", 302, "198.51.100.1")); !errors.Is(err, kernel.ErrNotFound) {
		t.Fatalf("RepairSandbox of a dead mount: %v", err)
	}
}

func TestWatch(t *testing.T) {
	hst := newHost(t)
	sp := spec("sb", 303, "198.51.100.1")
	must(t, hst.k.CreateSandbox(sp))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := hst.k.Watch(ctx, "sb")
	must(t, err)
	next := func(what string, match func(kernel.Event) bool) kernel.Event {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case e, ok := <-ch:
				if !ok {
					t.Fatalf("%s: channel closed", what)
				}
				if match(e) {
					return e
				}
			case <-timeout:
				t.Fatalf("no event: %s", what)
			}
		}
	}
	ip := netip.MustParseAddr("203.0.113.2")
	mac := mustMAC("02:42:0a:00:00:02")
	hst.outside(t, "sb", kerneltest.SetNeighbor(ip, mac))
	next("a neighbour", func(e kernel.Event) bool {
		return e.Kind == kernel.EventNeighbor && !e.Deleted && e.Neighbor == kernel.Neighbor{IP: ip, MAC: mac}
	})
	hst.inSandbox(t, "sb", "ip", "neigh", "replace", ip.String(), "lladdr", "02:42:0a:00:00:09", "dev", kernel.VXLANName, "nud", "noarp")
	next("a NOARP neighbour", func(e kernel.Event) bool {
		return e.Kind == kernel.EventNeighbor && e.Neighbor.NotPermanent && e.Neighbor.MAC == mustMAC("02:42:0a:00:00:09")
	})
	hst.inSandbox(t, "sb", "ip", "neigh", "del", ip.String(), "dev", kernel.VXLANName)
	next("a deleted neighbour", func(e kernel.Event) bool { return e.Kind == kernel.EventNeighbor && e.Deleted })
	vtep := netip.MustParseAddr("198.51.100.2")
	hst.outside(t, "sb", kerneltest.AddFDB(mac, vtep))
	next("an FDB entry", func(e kernel.Event) bool {
		return e.Kind == kernel.EventFDB && !e.Deleted && e.FDB == kernel.FDBEntry{MAC: mac, VTEP: vtep}
	})
	hst.inSandbox(t, "sb", "bridge", "fdb", "del", mac.String(), "dev", kernel.VXLANName, "dst", vtep.String(), "self")
	next("a deleted FDB entry", func(e kernel.Event) bool { return e.Kind == kernel.EventFDB && e.Deleted })

	hst.inSandbox(t, "sb", "ip", "link", "set", kernel.VXLANName, "down")
	next("vxlan0 down", func(e kernel.Event) bool {
		return e.Kind == kernel.EventDevice && e.Device == kernel.VXLANName && e.Broken
	})
	_, err = hst.k.RepairSandbox(sp)
	must(t, err)
	next("vxlan0 up again", func(e kernel.Event) bool {
		return e.Kind == kernel.EventDevice && e.Device == kernel.VXLANName && !e.Broken
	})
	hst.inSandbox(t, "sb", "ip", "link", "del", kernel.BridgeName)
	next("br0 deleted", func(e kernel.Event) bool {
		return e.Kind == kernel.EventDevice && e.Device == kernel.BridgeName && e.Deleted
	})
	hst.inSandbox(t, "sb", "ip", "link", "del", kernel.VXLANName)
	next("vxlan0 deleted", func(e kernel.Event) bool {
		return e.Kind == kernel.EventDevice && e.Device == kernel.VXLANName && e.Deleted
	})
}
