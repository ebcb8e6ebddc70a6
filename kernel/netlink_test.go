package kernel_test

// Privileged tests of the netlink Kernel against the running kernel. They
// need root and skip (saying why) otherwise. Everything happens in
// throwaway namespaces from testns; the namespace the test process starts in
// is only read (TestMain checks that its links and mounts are unchanged).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/testns"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/kerneltest"
)

// ---- root namespace guard ----

// Other work may run on the same machine concurrently, so the guard only
// looks for what these tests could have left: mounts under the sandbox
// directories they used and root-namespace links with the names they use.

var (
	sandboxDirsMu sync.Mutex // guards sandboxDirs; leaf lock
	sandboxDirs   []string
)

func ourLinkName(name string) bool {
	return strings.HasPrefix(name, "ov") ||
		slices.Contains([]string{"ul0", "keep0", "keep1", kernel.BridgeName, kernel.VXLANName}, name)
}

func rootLinks() []string {
	var names []string
	if ls, err := netlink.LinkList(); err == nil {
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}

func mountPoints() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			out = append(out, fields[4])
		}
	}
	return out
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	before := rootLinks()
	code := m.Run()
	for _, l := range rootLinks() {
		if ourLinkName(l) && !slices.Contains(before, l) {
			fmt.Fprintf(os.Stderr, "FAIL: link %s appeared in the root namespace\n", l)
			code = 1
		}
	}
	sandboxDirsMu.Lock()
	dirs := slices.Clone(sandboxDirs)
	sandboxDirsMu.Unlock()
	for _, mp := range mountPoints() {
		for _, d := range dirs {
			if strings.HasPrefix(mp, d+"/") {
				fmt.Fprintf(os.Stderr, "FAIL: mount %s left behind\n", mp)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// ---- helpers ----

type host struct {
	ns  netns.NsHandle
	h   *netlink.Handle // for inspection of the host namespace
	k   *kernel.Netlink
	dir string
}

func newHost(t *testing.T) *host {
	t.Helper()
	ns := testns.New(t)
	dir := t.TempDir()
	sandboxDirsMu.Lock()
	sandboxDirs = append(sandboxDirs, dir)
	sandboxDirsMu.Unlock()
	k, err := kernel.NewNetlink(kernel.NetlinkConfig{HostNS: ns, SandboxDir: dir})
	if err != nil {
		t.Fatalf("NewNetlink: %v", err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		k.Close()
		t.Fatalf("handle in host namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := k.RemoveLeftovers(nil); err != nil {
			t.Errorf("cleanup: RemoveLeftovers: %v", err)
		}
		k.Close()
		h.Close()
	})
	return &host{ns: ns, h: h, k: k, dir: dir}
}

// sandboxNS opens the namespace of a sandbox for inspection.
func (hst *host) sandboxNS(t *testing.T, name string) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	ns, err := netns.GetFromPath(filepath.Join(hst.dir, name))
	if err != nil {
		t.Fatalf("open sandbox %s namespace: %v", name, err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		t.Fatalf("handle in sandbox %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	return ns, h
}

func hostLinkNames(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatalf("list links: %v", err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// assertSandboxes checks that exactly the named sandboxes exist (list, files
// and mounts) and that no temporary VXLAN device is left in the host.
func (hst *host) assertSandboxes(t *testing.T, want ...string) {
	t.Helper()
	got, err := hst.k.Sandboxes()
	if err != nil {
		t.Fatalf("Sandboxes: %v", err)
	}
	if want == nil {
		want = []string{}
	}
	if got == nil {
		got = []string{}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Sandboxes() = %v, want %v", got, want)
	}
	entries, _ := os.ReadDir(hst.dir)
	if len(entries) != len(want) {
		t.Errorf("sandbox dir holds %d entries, want %d", len(entries), len(want))
	}
	for _, mp := range mountPoints() {
		if strings.HasPrefix(mp, hst.dir+"/") && !slices.Contains(want, filepath.Base(mp)) {
			t.Errorf("leftover mount %s", mp)
		}
	}
	for _, n := range hostLinkNames(t, hst.h) {
		if strings.HasPrefix(n, kernel.HostVXLANPrefix) {
			t.Errorf("leftover host link %s", n)
		}
	}
}

func spec(name string, vni uint32, local string) kernel.SandboxSpec {
	return kernel.SandboxSpec{Name: name, VNI: vni, Port: 4789, Local: netip.MustParseAddr(local), MTU: 1450}
}

func mustMAC(s string) hwaddr.MAC {
	m, err := hwaddr.Parse(s)
	if err != nil {
		panic(err)
	}
	return m
}

func linkUp(l netlink.Link) bool { return l.Attrs().Flags&net.FlagUp != 0 }

// outside applies ops in a sandbox through a socket of the test's own, as
// an operator's ip or bridge would: Watch reports them.
func (hst *host) outside(t *testing.T, sandbox string, ops ...kernel.EntryOp) {
	t.Helper()
	_, sh := hst.sandboxNS(t, sandbox)
	l, err := sh.LinkByName(kernel.VXLANName)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		nb := &netlink.Neigh{LinkIndex: l.Attrs().Index, State: netlink.NUD_PERMANENT}
		if op.Kind == kernel.OpSetNeighbor || op.Kind == kernel.OpDeleteNeighbor {
			nb.IP, nb.HardwareAddr, nb.Family = op.Neighbor.IP.AsSlice(), op.Neighbor.MAC.HardwareAddr(), unix.AF_INET6
			if op.Neighbor.IP.Is4() {
				nb.Family = unix.AF_INET
			}
		} else {
			nb.IP, nb.HardwareAddr = op.FDB.VTEP.AsSlice(), op.FDB.MAC.HardwareAddr()
			nb.Family, nb.Flags = unix.AF_BRIDGE, netlink.NTF_SELF
		}
		switch {
		case op.Kind == kernel.OpAddFDB && op.FDB.MAC.IsZero():
			err = sh.NeighAppend(nb)
		case op.Kind == kernel.OpSetNeighbor || op.Kind == kernel.OpAddFDB:
			err = sh.NeighSet(nb)
		default:
			err = sh.NeighDel(nb)
		}
		if err != nil {
			t.Fatalf("outside: %v: %v", &op, err)
		}
	}
}

// deleteLink deletes a device in a sandbox from outside.
func (hst *host) deleteLink(t *testing.T, sandbox, name string) {
	t.Helper()
	_, sh := hst.sandboxNS(t, sandbox)
	l, err := sh.LinkByName(name)
	if err == nil {
		err = sh.LinkDel(l)
	}
	if err != nil {
		t.Fatalf("delete %s in sandbox %s: %v", name, sandbox, err)
	}
}

// ---- tests ----

// TestContract: the netlink kernel keeps the rules the fake keeps
// (kernel/fakekernel runs the same suite against it).
func TestContract(t *testing.T) {
	kerneltest.Run(t, func(t *testing.T) kerneltest.Harness {
		hst := newHost(t)
		return kerneltest.Harness{K: hst.k, Outside: hst.outside, Break: hst.deleteLink}
	})
}

func TestCreateSandbox(t *testing.T) {
	hst := newHost(t)
	before := hostLinkNames(t, hst.h)
	sp := spec("net1", 4242, "198.51.100.1")
	if err := hst.k.CreateSandbox(sp); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	hst.assertSandboxes(t, "net1")
	if after := hostLinkNames(t, hst.h); !slices.Equal(before, after) {
		t.Errorf("host links changed: %v -> %v", before, after)
	}

	sbNS, sh := hst.sandboxNS(t, "net1")
	lo, err := sh.LinkByName("lo")
	if err != nil || !linkUp(lo) {
		t.Errorf("lo: %v, up=%v", err, err == nil && linkUp(lo))
	}
	br, err := sh.LinkByName(kernel.BridgeName)
	if err != nil {
		t.Fatalf("bridge: %v", err)
	}
	if br.Type() != "bridge" || br.Attrs().MTU != 1450 || !linkUp(br) {
		t.Errorf("bridge: type %s MTU %d up %v", br.Type(), br.Attrs().MTU, linkUp(br))
	}
	l, err := sh.LinkByName(kernel.VXLANName)
	if err != nil {
		t.Fatalf("vxlan: %v", err)
	}
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		t.Fatalf("vxlan0 is a %T", l)
	}
	if vx.VxlanId != 4242 || vx.Port != 4789 || vx.Learning || !vx.Proxy ||
		!vx.SrcAddr.Equal(net.ParseIP("198.51.100.1")) || vx.MasterIndex != br.Attrs().Index ||
		vx.MTU != 1450 || !linkUp(vx) {
		t.Errorf("vxlan0: id %d port %d learning %v proxy %v local %s master %d (bridge %d) MTU %d up %v",
			vx.VxlanId, vx.Port, vx.Learning, vx.Proxy, vx.SrcAddr, vx.MasterIndex, br.Attrs().Index, vx.MTU, linkUp(vx))
	}
	var v6 string
	if err := testns.Do(sbNS, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + kernel.VXLANName + "/disable_ipv6")
		v6 = strings.TrimSpace(string(b))
		return err
	}); err != nil || v6 != "0" {
		t.Errorf("vxlan0 disable_ipv6 = %q, %v; want 0", v6, err)
	}

	// A duplicate name fails with ErrExists and leaves the first intact.
	err = hst.k.CreateSandbox(spec("net1", 4243, "198.51.100.1"))
	if !errors.Is(err, kernel.ErrExists) {
		t.Errorf("duplicate CreateSandbox: %v, want ErrExists", err)
	}
	if l, err := sh.LinkByName(kernel.VXLANName); err != nil || l.(*netlink.Vxlan).VxlanId != 4242 {
		t.Errorf("first sandbox damaged: %v", err)
	}
	hst.assertSandboxes(t, "net1")
	if errs := hst.k.Program("net1", []kernel.EntryOp{kerneltest.SetNeighbor(netip.MustParseAddr("203.0.113.9"), mustMAC("02:00:00:00:00:09"))}); errs != nil {
		t.Errorf("Program after duplicate create: %v", errs)
	}

	if err := hst.k.DeleteSandbox("net1"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	hst.assertSandboxes(t)
	if after := hostLinkNames(t, hst.h); !slices.Equal(before, after) {
		t.Errorf("host links after delete: %v, want %v", after, before)
	}
}

func TestNewNetlinkDefaultsToCurrentNamespace(t *testing.T) {
	ns := testns.New(t)
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var k *kernel.Netlink
	dir := t.TempDir() + "/sub/dir"
	sandboxDirsMu.Lock()
	sandboxDirs = append(sandboxDirs, dir)
	sandboxDirsMu.Unlock()
	if err := testns.Do(ns, func() error {
		var err error
		k, err = kernel.NewNetlink(kernel.NetlinkConfig{SandboxDir: dir})
		return err
	}); err != nil {
		t.Fatalf("NewNetlink: %v", err)
	}
	defer func() {
		if err := k.RemoveLeftovers(nil); err != nil {
			t.Error(err)
		}
		k.Close()
	}()
	if err := k.CreateSandbox(spec("n", 10, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	if err := k.AddVeth("n", kernel.Veth{HostName: "ovh-dflt", SandboxName: "ovs-dflt", MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.LinkByName("ovh-dflt"); err != nil {
		t.Errorf("host end not in the namespace current at NewNetlink: %v", err)
	}
}

// TestBadSandboxNames: names that are no file name in the sandbox
// directory are refused, and a call on a missing sandbox leaves nothing
// in the host (kerneltest.MissingSandbox checks its errors).
func TestBadSandboxNames(t *testing.T) {
	hst := newHost(t)
	k := hst.k
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if err := k.CreateSandbox(spec(bad, 5, "198.51.100.1")); err == nil {
			t.Errorf("CreateSandbox(%q) succeeded", bad)
		}
	}
	if err := k.AddVeth("nope", kernel.Veth{HostName: "ovh-x", SandboxName: "ovs-x"}); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("AddVeth on a missing sandbox: %v, want ErrNotFound", err)
	}
	if _, err := hst.h.LinkByName("ovh-x"); err == nil {
		t.Errorf("AddVeth on a missing sandbox left a host link")
	}
	hst.assertSandboxes(t)
}

func TestCreateSandboxFailureLeavesNothing(t *testing.T) {
	hst := newHost(t)
	before := hostLinkNames(t, hst.h)
	if err := hst.k.CreateSandbox(spec("a", 7, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		spec   kernel.SandboxSpec
		exists bool
	}{
		{"VNI in use on the same port", spec("b", 7, "198.51.100.1"), true},
		{"MTU too large", kernel.SandboxSpec{Name: "b", VNI: 8, Port: 4789, Local: netip.MustParseAddr("198.51.100.1"), MTU: 100000}, false},
		{"MTU too small", kernel.SandboxSpec{Name: "b", VNI: 8, Port: 4789, Local: netip.MustParseAddr("198.51.100.1"), MTU: 10}, false},
		{"VNI zero", spec("b", 0, "198.51.100.1"), false},
		{"VNI too large", spec("b", 1<<24, "198.51.100.1"), false},
		{"no port", kernel.SandboxSpec{Name: "b", VNI: 8, Local: netip.MustParseAddr("198.51.100.1"), MTU: 1450}, false},
		{"no local", kernel.SandboxSpec{Name: "b", VNI: 8, Port: 4789, MTU: 1450}, false},
	}
	for _, c := range cases {
		err := hst.k.CreateSandbox(c.spec)
		t.Logf("%s: %v", c.name, err)
		if err == nil {
			t.Errorf("%s: CreateSandbox succeeded", c.name)
			continue
		}
		if got := errors.Is(err, kernel.ErrExists); got != c.exists {
			t.Errorf("%s: errors.Is(ErrExists) = %v, want %v", c.name, got, c.exists)
		}
		hst.assertSandboxes(t, "a")
	}
	if err := hst.k.DeleteSandbox("a"); err != nil {
		t.Fatal(err)
	}
	if after := hostLinkNames(t, hst.h); !slices.Equal(before, after) {
		t.Errorf("host links: %v, want %v", after, before)
	}
}

func TestVeth(t *testing.T) {
	hst := newHost(t)
	if err := hst.k.CreateSandbox(spec("net", 100, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	_, sh := hst.sandboxNS(t, "net")
	mac := mustMAC("02:42:c0:a8:00:05")
	v := kernel.Veth{HostName: "ovh-ep1", SandboxName: "ovs-ep1", MAC: mac, MTU: 1450}
	if err := hst.k.AddVeth("net", v); err != nil {
		t.Fatalf("AddVeth: %v", err)
	}
	he, err := hst.h.LinkByName("ovh-ep1")
	if err != nil {
		t.Fatalf("host end: %v", err)
	}
	if he.Type() != "veth" || he.Attrs().HardwareAddr.String() != mac.String() || he.Attrs().MTU != 1450 || linkUp(he) {
		t.Errorf("host end: type %s MAC %s MTU %d up %v", he.Type(), he.Attrs().HardwareAddr, he.Attrs().MTU, linkUp(he))
	}
	se, err := sh.LinkByName("ovs-ep1")
	if err != nil {
		t.Fatalf("sandbox end: %v", err)
	}
	br, _ := sh.LinkByName(kernel.BridgeName)
	if se.Attrs().MasterIndex != br.Attrs().Index || !linkUp(se) || se.Attrs().MTU != 1450 {
		t.Errorf("sandbox end: master %d (bridge %d) up %v MTU %d", se.Attrs().MasterIndex, br.Attrs().Index, linkUp(se), se.Attrs().MTU)
	}

	// Name clashes fail with ErrExists and leave nothing new behind.
	hostBefore := hostLinkNames(t, hst.h)
	sbBefore := hostLinkNames(t, sh)
	for _, dup := range []kernel.Veth{
		{HostName: "ovh-ep1", SandboxName: "ovs-ep2", MTU: 1450},
		{HostName: "ovh-ep2", SandboxName: "ovs-ep1", MTU: 1450},
		{HostName: "ovh-ep3", SandboxName: kernel.BridgeName, MTU: 1450},
	} {
		if err := hst.k.AddVeth("net", dup); !errors.Is(err, kernel.ErrExists) {
			t.Errorf("AddVeth(%+v): %v, want ErrExists", dup, err)
		}
	}
	if got := hostLinkNames(t, hst.h); !slices.Equal(got, hostBefore) {
		t.Errorf("host links %v, want %v", got, hostBefore)
	}
	if got := hostLinkNames(t, sh); !slices.Equal(got, sbBefore) {
		t.Errorf("sandbox links %v, want %v", got, sbBefore)
	}

	if err := hst.k.DeleteVeth("net", kernel.BridgeName); err == nil {
		t.Errorf("DeleteVeth of the bridge succeeded")
	}
	if err := hst.k.DeleteVeth("net", "ovs-ep1"); err != nil {
		t.Fatalf("DeleteVeth: %v", err)
	}
	if _, err := hst.h.LinkByName("ovh-ep1"); err == nil {
		t.Errorf("host end survives DeleteVeth")
	}

	// DeleteSandbox takes the veths (and their host ends) with it.
	if err := hst.k.AddVeth("net", kernel.Veth{HostName: "ovh-ep4", SandboxName: "ovs-ep4", MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	if err := hst.k.DeleteSandbox("net"); err != nil {
		t.Fatal(err)
	}
	if _, err := hst.h.LinkByName("ovh-ep4"); err == nil {
		t.Errorf("host end survives DeleteSandbox")
	}
	hst.assertSandboxes(t)
}

func TestRemoveLeftovers(t *testing.T) {
	hst := newHost(t)
	baseline := hostLinkNames(t, hst.h)

	// A previous run's sandbox with a veth and entries, and one the new
	// instance adopts.
	if err := hst.k.CreateSandbox(spec("old", 300, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	if err := hst.k.CreateSandbox(spec("adopted", 302, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	adoptedFDB := kernel.FDBEntry{MAC: hwaddr.MAC{2, 0, 0, 0, 0, 9}, VTEP: netip.MustParseAddr("198.51.100.3")}
	kerneltest.Program(t, hst.k, "adopted", kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: adoptedFDB})
	if err := hst.k.AddVeth("old", kernel.Veth{HostName: "ovh-old", SandboxName: "ovs-old", MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	kerneltest.Program(t, hst.k, "old", kerneltest.AddFDB(hwaddr.MAC{}, netip.MustParseAddr("198.51.100.2")))
	// A half-made sandbox: a mount point file without a mount.
	if err := os.WriteFile(filepath.Join(hst.dir, "half"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	// A host-side VXLAN device stranded before its move, and a host veth pair.
	stranded := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: kernel.HostVXLANPrefix + "00012c00001", TxQLen: -1},
		VxlanId: 301, Port: 4789, SrcAddr: net.ParseIP("198.51.100.1")}
	if err := hst.h.LinkAdd(stranded); err != nil {
		t.Fatal(err)
	}
	if err := hst.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: kernel.HostVethPrefix + "-lost", TxQLen: -1},
		PeerName: kernel.HostVethPrefix + "-lostp", PeerTxQLen: -1}); err != nil {
		t.Fatal(err)
	}
	// Not ours: must survive.
	if err := hst.h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "keep0", TxQLen: -1},
		PeerName: "keep1", PeerTxQLen: -1}); err != nil {
		t.Fatal(err)
	}

	// A new instance (as after a restart) cleans up.
	k2, err := kernel.NewNetlink(kernel.NetlinkConfig{HostNS: hst.ns, SandboxDir: hst.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Close()
	got, _ := k2.Sandboxes()
	if !slices.Equal(got, []string{"adopted", "half", "old"}) {
		t.Errorf("Sandboxes() = %v, want [adopted half old]", got)
	}
	if err := k2.RemoveLeftovers(func(name string) bool { return name == "adopted" }); err != nil {
		t.Fatalf("RemoveLeftovers: %v", err)
	}
	hst.assertSandboxes(t, "adopted")
	if fdb, err := k2.FDB("adopted"); err != nil || !slices.Contains(fdb, adoptedFDB) {
		t.Errorf("adopted sandbox lost its state: %v %v", fdb, err)
	}
	if err := k2.DeleteSandbox("adopted"); err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(baseline, []string{"keep0", "keep1"})
	slices.Sort(want)
	if got := hostLinkNames(t, hst.h); !slices.Equal(got, want) {
		t.Errorf("host links after RemoveLeftovers: %v, want %v", got, want)
	}
	// Their VNIs are free again at once, even for the old instance whose
	// cached handle went stale.
	if err := k2.CreateSandbox(spec("new", 300, "198.51.100.1")); err != nil {
		t.Errorf("re-use VNI of removed sandbox: %v", err)
	}
	if err := k2.CreateSandbox(spec("new2", 301, "198.51.100.1")); err != nil {
		t.Errorf("re-use VNI of removed host VXLAN device: %v", err)
	}
	if errs := hst.k.Program("old", []kernel.EntryOp{kerneltest.AddFDB(hwaddr.MAC{}, netip.MustParseAddr("198.51.100.2"))}); len(errs) != 1 || !errors.Is(errs[0], kernel.ErrNotFound) {
		t.Errorf("old instance on a removed sandbox: %v, want ErrNotFound", errs)
	}
	if err := k2.RemoveLeftovers(nil); err != nil {
		t.Fatal(err)
	}
	hst.assertSandboxes(t)
}

func TestConcurrentSandboxes(t *testing.T) {
	hst := newHost(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				name := fmt.Sprintf("c%d", i)
				if err := hst.k.CreateSandbox(spec(name, uint32(500+i), "198.51.100.1")); err != nil {
					return err
				}
				if err := hst.k.AddVeth(name, kernel.Veth{HostName: fmt.Sprintf("ovh-c%d", i), SandboxName: "ovs-c", MTU: 1450}); err != nil {
					return err
				}
				for j := range 20 {
					mac := hwaddr.MAC{0x02, 0, 0, 0, byte(i), byte(j)}
					if err := errors.Join(hst.k.Program(name, []kernel.EntryOp{
						kerneltest.AddFDB(mac, netip.AddrFrom4([4]byte{198, 51, 100, byte(2 + j)})),
						kerneltest.SetNeighbor(netip.AddrFrom4([4]byte{203, 0, 113, byte(j + 1)}), mac),
					})...); err != nil {
						return err
					}
				}
				fdb, err := hst.k.FDB(name)
				if err != nil {
					return err
				}
				if len(fdb) != 20 {
					return fmt.Errorf("%s: %d FDB entries, want 20", name, len(fdb))
				}
				return hst.k.DeleteSandbox(name)
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	hst.assertSandboxes(t)
}

// ---- data path ----

type dpHost struct {
	*host
	container netns.NsHandle
	ch        *netlink.Handle // in the container
	mac       hwaddr.MAC
	vtep      netip.Addr
	addrs     []netip.Addr // the container's overlay addresses
}

// echo starts a TCP echo server in ns on addr and returns its address.
func echo(t *testing.T, ns netns.NsHandle, addr netip.Addr) string {
	t.Helper()
	var ln net.Listener
	if err := testns.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip connects from ns to addr and checks that a message comes back.
func roundTrip(ns netns.NsHandle, addr string) error {
	return testns.Do(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		msg := []byte("hello across the overlay " + addr)
		if _, err := c.Write(msg); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != string(msg) {
			return fmt.Errorf("echo mismatch: %q", buf)
		}
		return nil
	})
}

func TestDataPath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		underlay [2]string // prefixes on the two hosts' underlay link
		mtu      int
	}{
		{"ipv4-underlay", [2]string{"198.51.100.1/24", "198.51.100.2/24"}, 1450},
		{"ipv6-underlay", [2]string{"2001:db8:ffff::1/64", "2001:db8:ffff::2/64"}, 1430},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := [2]*dpHost{{host: newHost(t)}, {host: newHost(t)}}
			// Underlay: a veth pair between the two host namespaces.
			err := hosts[0].h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", TxQLen: -1},
				PeerName: "ul0", PeerTxQLen: -1, PeerNamespace: netlink.NsFd(hosts[1].ns)})
			if err != nil {
				t.Fatalf("underlay veth: %v", err)
			}
			containerAddrs := [2][]string{{"203.0.113.1/24", "2001:db8:1::1/64"}, {"203.0.113.2/24", "2001:db8:1::2/64"}}
			macs := [2]hwaddr.MAC{mustMAC("02:42:cb:00:71:01"), mustMAC("02:42:cb:00:71:02")}
			for i, hst := range hosts {
				testns.SetUp(t, hst.h, "lo")
				ul := testns.SetUp(t, hst.h, "ul0")
				testns.AddAddr(t, hst.h, ul, tc.underlay[i])
				hst.vtep = netip.MustParsePrefix(tc.underlay[i]).Addr()
				hst.mac = macs[i]
				sp := kernel.SandboxSpec{Name: "ovnet", VNI: 4097, Port: 4789, Local: hst.vtep, MTU: tc.mtu}
				if err := hst.k.CreateSandbox(sp); err != nil {
					t.Fatalf("host %d: CreateSandbox: %v", i, err)
				}
				if err := hst.k.AddVeth("ovnet", kernel.Veth{HostName: "ovh-ctr", SandboxName: "ovs-ctr", MAC: hst.mac, MTU: tc.mtu}); err != nil {
					t.Fatalf("host %d: AddVeth: %v", i, err)
				}
				// Do what Docker does: move the host end into the container.
				hst.container = testns.New(t)
				he, err := hst.h.LinkByName("ovh-ctr")
				if err != nil {
					t.Fatal(err)
				}
				if err := hst.h.LinkSetNsFd(he, int(hst.container)); err != nil {
					t.Fatalf("move into container: %v", err)
				}
				hst.ch, err = netlink.NewHandleAt(hst.container, unix.NETLINK_ROUTE)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(hst.ch.Close)
				testns.SetUp(t, hst.ch, "lo")
				ce, err := hst.ch.LinkByName("ovh-ctr")
				if err != nil {
					t.Fatal(err)
				}
				if err := hst.ch.LinkSetName(ce, "eth0"); err != nil {
					t.Fatal(err)
				}
				for _, a := range containerAddrs[i] {
					testns.AddAddr(t, hst.ch, ce, a)
					hst.addrs = append(hst.addrs, netip.MustParsePrefix(a).Addr())
				}
				testns.SetUp(t, hst.ch, "eth0")
			}
			// Each side learns the other's endpoint, as the driver would.
			for i, hst := range hosts {
				peer := hosts[1-i]
				var ops []kernel.EntryOp
				for _, a := range peer.addrs {
					ops = append(ops, kerneltest.SetNeighbor(a, peer.mac))
				}
				kerneltest.Program(t, hst.k, "ovnet", append(ops, kerneltest.AddFDB(peer.mac, peer.vtep), kerneltest.AddFDB(hwaddr.MAC{}, peer.vtep))...)
			}
			for i, hst := range hosts {
				peer := hosts[1-i]
				for _, a := range peer.addrs {
					srv := echo(t, peer.container, a)
					if err := roundTrip(hst.container, srv); err != nil {
						t.Errorf("host %d container -> %s: %v", i, srv, err)
					} else {
						t.Logf("host %d container -> %s over %s: ok", i, srv, tc.name)
					}
				}
			}
			// Without the FDB entry, unicast traffic has nowhere to go.
			kerneltest.Program(t, hosts[0].k, "ovnet", kerneltest.DeleteFDB(hosts[1].mac, hosts[1].vtep), kerneltest.DeleteFDB(hwaddr.MAC{}, hosts[1].vtep))
			srv := echo(t, hosts[1].container, hosts[1].addrs[0])
			if err := testns.Do(hosts[0].container, func() error {
				c, err := net.DialTimeout("tcp", srv, 1500*time.Millisecond)
				if err == nil {
					c.Close()
					return errors.New("connected without an FDB entry")
				}
				return nil
			}); err != nil {
				t.Errorf("after deleting the FDB entries: %v", err)
			}
			for _, hst := range hosts {
				if err := hst.k.DeleteSandbox("ovnet"); err != nil {
					t.Errorf("DeleteSandbox: %v", err)
				}
				hst.assertSandboxes(t)
			}
		})
	}
}

// TestInspect reads a sandbox back as restore needs it: its VXLAN device's
// VNI, port and address, its bridge's MTU, and which veths carry a
// container (the other end moved out of the host namespace). A half-made
// sandbox (a mount point without a namespace) is not found.
func TestInspect(t *testing.T) {
	hst := newHost(t)
	if err := hst.k.CreateSandbox(spec("net1", 300, "198.51.100.1")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b"} {
		if err := hst.k.AddVeth("net1", kernel.Veth{HostName: "ovh" + v, SandboxName: "ovs" + v, MTU: 1450}); err != nil {
			t.Fatal(err)
		}
	}
	// Docker moves the host end of a joined veth into the container.
	ctr := testns.New(t)
	l, err := hst.h.LinkByName("ovha")
	if err != nil {
		t.Fatal(err)
	}
	if err := hst.h.LinkSetNsFd(l, int(ctr)); err != nil {
		t.Fatal(err)
	}
	info, err := hst.k.Inspect("net1")
	if err != nil {
		t.Fatal(err)
	}
	want := spec("net1", 300, "198.51.100.1")
	if info.Spec != want {
		t.Errorf("Inspect spec %+v, want %+v", info.Spec, want)
	}
	wantVeths := []kernel.SandboxVeth{{Name: "ovsa", Attached: true}, {Name: "ovsb"}}
	slices.SortFunc(info.Veths, func(a, b kernel.SandboxVeth) int { return strings.Compare(a.Name, b.Name) })
	if !slices.Equal(info.Veths, wantVeths) || info.Attached() != 1 {
		t.Errorf("Inspect veths %+v, want %+v", info.Veths, wantVeths)
	}
	if err := os.WriteFile(filepath.Join(hst.dir, "half"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := hst.k.Inspect("half"); !errors.Is(err, kernel.ErrNotFound) {
		t.Errorf("Inspect of a mount point without a namespace: %v, want ErrNotFound", err)
	}
}
