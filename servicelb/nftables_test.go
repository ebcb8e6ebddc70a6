package servicelb

// Privileged tests of the real Programmer's contract against the running
// kernel's nf_tables, in throwaway namespaces (no traffic: see
// datapath_test.go). Each checks on cleanup that the namespace the test
// process started in has no table of ours; that namespace is only read.

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
	"github.com/overlay-plugin/overlay-plugin/internal/testns"
)

// newSandbox returns the path of a fresh namespace with only lo, and the
// temporary directory it is mounted in.
func newSandbox(t *testing.T) (path, dir string) {
	t.Helper()
	testns.RequireRoot(t)
	rootClean(t)
	path = testns.Publish(t, testns.New(t), "slb")
	return path, filepath.Dir(path)
}

// rootClean fails t if the starting namespace ends up with our table.
func rootClean(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		c, err := nftutil.Conn(0)
		if err != nil {
			t.Error(err)
			return
		}
		if present, err := nftutil.HasTable(c, newTable()); err != nil || present {
			t.Errorf("root namespace has table %s (%v)", TableName, err)
		}
	})
}

// tryNft runs the nft command in the namespace at path. These tests need
// it: they check the table as nft renders it to an operator, and change
// it from outside as an operator would; google/nftables, which wrote the
// table, would be no independent witness.
func tryNft(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("needs the nft command (Debian package nftables) to read the table as an operator sees it: %v", err)
	}
	out, err := exec.Command("nsenter", append([]string{"--net=" + path, "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// nft runs the nft command in the namespace at path, failing t on error.
func nft(t *testing.T, path string, args ...string) string {
	t.Helper()
	out, err := tryNft(t, path, args...)
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

var handleRE = regexp.MustCompile(`table inet ` + TableName + ` \{ # handle (\d+)`)

// tableHandle is our table's handle, which changes whenever the table is
// recreated; "" if there is no table.
func tableHandle(t *testing.T, path string) string {
	t.Helper()
	out, err := tryNft(t, path, "-a", "list", "table", "inet", TableName)
	if err != nil {
		if strings.Contains(out, "No such file or directory") {
			return ""
		}
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	m := handleRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no handle in\n%s", out)
	}
	return m[1]
}

func listing(t *testing.T, path string) string {
	t.Helper()
	return nft(t, path, "list", "table", "inet", TableName)
}

func sampleServices() []Service {
	return []Service{
		{Name: "web", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.3", "203.0.113.1", "203.0.113.2")},
		{Name: "db", VIP: a("203.0.113.101")},
		{Name: "web6", VIP: a("fd00:5b::100"), Backends: addrs("fd00:5b::1", "fd00:5b::2")},
	}
}

func TestApplyProgramsTheTable(t *testing.T) {
	path, _ := newSandbox(t)
	lb := NewNftables()
	if err := lb.Apply(path, sampleServices()); err != nil {
		t.Fatal(err)
	}
	text := listing(t, path)
	for _, want := range []string{
		"type nat hook output priority -100; policy accept;",
		"ip daddr vmap @vips4",
		"ip6 daddr vmap @vips6",
		"elements = { 203.0.113.100 : goto svc-203.0.113.100 }",
		"elements = { 203.0.113.101 }",
		"numgen random mod 3 vmap @svc-203.0.113.100",
		"elements = { 0 : goto be-203.0.113.100-203.0.113.1, 1 : goto be-203.0.113.100-203.0.113.2, 2 : goto be-203.0.113.100-203.0.113.3 }",
		"counter packets 0 bytes 0 dnat ip to 203.0.113.1",
		"numgen random mod 2 vmap @svc-fd00_5b__100",
		"dnat ip6 to fd00:5b::2",
		"type filter hook output priority filter; policy accept;",
		"ct status dnat accept",
		"ip daddr @empty4 meta l4proto tcp reject with tcp reset",
		"ip6 daddr @empty6 reject",
		`comment "overlay-plugin: service web backend 203.0.113.2"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("listing lacks %q:\n%s", want, text)
		}
	}
	got, err := lb.Counters(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[Backend]uint64{}
	for _, s := range sampleServices() {
		for _, b := range s.Backends {
			want[Backend{s.VIP, b}] = 0
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Counters = %v, want %v", got, want)
	}
}

// TestApplyReplacesOnlyWhenNeeded: an Apply that changes nothing sends
// nothing (the table keeps its handle); one that finds the table damaged
// from outside recreates it; one that changes a service changes the table
// in place.
func TestApplyReplacesOnlyWhenNeeded(t *testing.T) {
	path, lb, svcs := sampleSandbox(t)
	h1, text := tableHandle(t, path), listing(t, path)
	shuffled := []Service{svcs[2], svcs[0], svcs[1]}
	shuffled[1].Backends = append(addrs("203.0.113.2"), shuffled[1].Backends...)
	if err := lb.Apply(path, shuffled); err != nil {
		t.Fatal(err)
	}
	if h := tableHandle(t, path); h != h1 {
		t.Errorf("the same services again: table recreated (handle %s -> %s)", h1, h)
	}

	for name, damage := range map[string][]string{
		"rule flushed":    {"flush", "chain", "inet", TableName, "be-203.0.113.100-203.0.113.2"},
		"element deleted": {"delete", "element", "inet", TableName, "empty4", "{ 203.0.113.101 }"},
		"chain added":     {"add", "chain", "inet", TableName, "extra"},
	} {
		nft(t, path, damage...)
		before := tableHandle(t, path)
		if err := lb.Apply(path, svcs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if h := tableHandle(t, path); h == before {
			t.Errorf("%s: not repaired", name)
		}
		if got := listing(t, path); got != text {
			t.Errorf("%s: after Apply\n%s\nwant\n%s", name, got, text)
		}
	}

	svcs[0].Backends = addrs("203.0.113.2", "203.0.113.3")
	before := tableHandle(t, path)
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	if h := tableHandle(t, path); h != before {
		t.Error("a backend removed: table recreated, not changed in place")
	}
	if strings.Contains(listing(t, path), "203.0.113.1 ") {
		t.Error("the removed backend is still there")
	}
}

func TestInvalidInputChangesNothing(t *testing.T) {
	path, _ := newSandbox(t)
	lb := NewNftables()
	if err := lb.Apply(path, sampleServices()); err != nil {
		t.Fatal(err)
	}
	h, text := tableHandle(t, path), listing(t, path)
	for _, bad := range [][]Service{
		append(sampleServices(), Service{Name: "dup", VIP: a("203.0.113.100")}),
		{{Name: "mixed", VIP: a("203.0.113.100"), Backends: addrs("fd00:5b::1")}},
		{{Name: "self", VIP: a("203.0.113.100"), Backends: addrs("203.0.113.100")}},
		{{Name: "zero"}},
	} {
		if err := lb.Apply(path, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Apply(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	if tableHandle(t, path) != h || listing(t, path) != text {
		t.Error("refused input changed the table")
	}
}

func TestNoSandbox(t *testing.T) {
	_, dir := newSandbox(t)
	lb := NewNftables()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing"), plain} {
		if err := lb.Apply(p, sampleServices()); !errors.Is(err, ErrNoSandbox) || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Apply(%s) = %v, want ErrNoSandbox and os.ErrNotExist", p, err)
		}
		if _, err := lb.Counters(p); !errors.Is(err, ErrNoSandbox) {
			t.Errorf("Counters(%s) = %v, want ErrNoSandbox", p, err)
		}
		if err := lb.Remove(p); err != nil {
			t.Errorf("Remove(%s) = %v, want nil", p, err)
		}
	}
	// A namespace, but not a network one: an error, not a gone sandbox.
	err := lb.Apply("/proc/self/ns/mnt", sampleServices())
	if err == nil || errors.Is(err, ErrNoSandbox) || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("Apply on a mount namespace = %v", err)
	}
}

// foreignTable mimics what Docker leaves in a container's namespace: NAT
// for its embedded DNS server, here in a table of its own.
const foreignTable = `table ip slbdocker {
	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr 127.0.0.11 udp dport 53 dnat to 127.0.0.11:5353
	}
	chain filter {
		type filter hook output priority 0; policy accept;
		ip daddr 203.0.113.250 drop
	}
}
`

func TestRemoveAndOtherTables(t *testing.T) {
	path, dir := newSandbox(t)
	script := filepath.Join(dir, "foreign.nft")
	if err := os.WriteFile(script, []byte(foreignTable), 0o600); err != nil {
		t.Fatal(err)
	}
	nft(t, path, "-f", script)
	foreign := nft(t, path, "list", "table", "ip", "slbdocker")
	lb := NewNftables()

	if err := lb.Apply(path, sampleServices()); err != nil {
		t.Fatal(err)
	}
	if err := lb.Apply(path, sampleServices()[:1]); err != nil {
		t.Fatal(err)
	}
	if err := lb.Remove(path); err != nil {
		t.Fatal(err)
	}
	if h := tableHandle(t, path); h != "" {
		t.Errorf("after Remove, the table is still there (handle %s)", h)
	}
	if err := lb.Remove(path); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if got, err := lb.Counters(path); err != nil || len(got) != 0 {
		t.Errorf("Counters without a table = %v, %v", got, err)
	}
	if err := lb.Apply(path, sampleServices()); err != nil {
		t.Fatal(err)
	}
	if err := lb.Apply(path, nil); err != nil {
		t.Fatal(err)
	}
	if h := tableHandle(t, path); h != "" {
		t.Errorf("after Apply of no services, the table is still there (handle %s)", h)
	}
	if err := lb.Apply(path, nil); err != nil {
		t.Errorf("Apply of no services without a table: %v", err)
	}
	if got := nft(t, path, "list", "table", "ip", "slbdocker"); got != foreign {
		t.Errorf("the other table changed:\n%s\nwant\n%s", got, foreign)
	}
}

func manyServices(services, backends int) []Service {
	var svcs []Service
	base := netip.MustParseAddr("198.18.0.0")
	next := func() netip.Addr { base = base.Next(); return base }
	for i := range services {
		s := Service{Name: fmt.Sprintf("svc%d", i), VIP: next()}
		for range backends {
			s.Backends = append(s.Backends, next())
		}
		svcs = append(svcs, s)
	}
	return svcs
}

// TestManyServices programs a large table in one batch: 200 services of
// 10 backends each, about a megabyte and 5,000 netlink messages.
func TestManyServices(t *testing.T) {
	path, _ := newSandbox(t)
	svcs := manyServices(200, 10)
	lb := NewNftables()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	got, err := lb.Counters(path)
	if err != nil || len(got) != 2000 {
		t.Fatalf("Counters: %d entries, %v", len(got), err)
	}
	h := tableHandle(t, path)
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	if tableHandle(t, path) != h {
		t.Error("the same services again: table recreated")
	}
	svcs[7].Backends = svcs[7].Backends[:3]
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	if got, _ := lb.Counters(path); len(got) != 1993 {
		t.Errorf("Counters after the change: %d entries", len(got))
	}
}

// TestLostAcknowledgements: with a receive buffer too small for the
// acknowledgements of a large batch, the kernel commits the batch but
// drops acknowledgements, and the flush fails with ENOBUFS; Apply sees
// that the table is what it wanted and succeeds.
func TestLostAcknowledgements(t *testing.T) {
	path, _ := newSandbox(t)
	svcs := manyServices(200, 10)
	saved := recvPerEntry
	recvPerEntry = 0
	t.Cleanup(func() { recvPerEntry = saved })

	norm, _ := Normalize(svcs)
	send, recv := socketBuffers(norm)
	err := inNamespace(path, send, recv, func(_ netns.NsHandle, c *nftables.Conn) error {
		if _, err := build(norm, nil).queueReplace(c); err != nil {
			return err
		}
		return c.Flush()
	})
	if !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("a bare flush with a small receive buffer: %v, want ENOBUFS", err)
	}
	if err := NewNftables().Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := NewNftables().Apply(path, svcs); err != nil {
		t.Errorf("Apply: %v", err)
	}
	if got, err := NewNftables().Counters(path); err != nil || len(got) != 2000 {
		t.Errorf("Counters: %d entries, %v", len(got), err)
	}
}

// TestConcurrentSandboxes: one Programmer, several sandboxes changed at
// once (as the driver does for the containers of a network), under the
// race detector.
func TestConcurrentSandboxes(t *testing.T) {
	paths := make([]string, 4)
	for i := range paths {
		paths[i], _ = newSandbox(t)
	}
	lb := NewNftables()
	all := manyServices(5, 4)
	errc := make(chan error, len(paths))
	for i, path := range paths {
		go func() {
			errc <- func() error {
				for j := range 10 {
					svcs := make([]Service, len(all))
					copy(svcs, all)
					for k := range svcs {
						svcs[k].Backends = all[k].Backends[:1+(i+j+k)%4]
					}
					if err := lb.Apply(path, svcs); err != nil {
						return err
					}
					if _, err := lb.Counters(path); err != nil {
						return err
					}
				}
				return lb.Apply(path, all[:i+1])
			}()
		}()
	}
	for range paths {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	for i, path := range paths {
		got, err := lb.Counters(path)
		if err != nil || len(got) != 4*(i+1) {
			t.Errorf("sandbox %d: %d counters, %v; want %d", i, len(got), err, 4*(i+1))
		}
	}
}

// TestManyVIPs: 2,000 services of one backend each put 2,000 elements in
// one map, more than one netlink message can carry.
func TestManyVIPs(t *testing.T) {
	path, _ := newSandbox(t)
	svcs := manyServices(2000, 1)
	lb := NewNftables()
	if err := lb.Apply(path, svcs); err != nil {
		t.Fatal(err)
	}
	norm, _ := Normalize(svcs)
	err := inNamespace(path, bufferBase, bufferBase, func(_ netns.NsHandle, c *nftables.Conn) error {
		have, err := readTable(c, true)
		if err != nil {
			return err
		}
		if !build(norm, nil).sameAs(have) {
			return errors.New("the kernel's table is not the one wanted")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
