package vxlanfilter

// Privileged tests against the running kernel's nf_tables, in throwaway
// namespaces from testns (they skip, saying why, without root). Packets
// are real: UDP shaped like VXLAN, sent over the namespace's loopback from
// one of its addresses to another, which crosses the input hook.

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
	"github.com/overlay-plugin/overlay-plugin/internal/testns"
)

const port = 4789

var (
	host     = netip.MustParseAddr("198.51.100.1")
	member   = netip.MustParseAddr("198.51.100.2")
	outsider = netip.MustParseAddr("198.51.100.3")
	host6    = netip.MustParseAddr("2001:db8:100::1")
	member6  = netip.MustParseAddr("2001:db8:100::2")
	outside6 = netip.MustParseAddr("2001:db8:100::3")
)

// bed is a namespace with the addresses above on its loopback, a filter
// in it, and a UDP socket on the VXLAN port of each family.
type bed struct {
	t    *testing.T
	ns   netns.NsHandle
	f    *Filter
	recv map[bool]*net.UDPConn // by IPv6
	conn *nftables.Conn
	seq  byte // the last datagram's number
}

func newBed(t *testing.T) *bed {
	t.Helper()
	testns.RequireRoot(t)
	ns := testns.New(t)
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo := testns.SetUp(t, h, "lo")
	for _, a := range []netip.Addr{host, member, outsider} {
		testns.AddAddr(t, h, lo, a.String()+"/32")
	}
	for _, a := range []netip.Addr{host6, member6, outside6} {
		testns.AddAddr(t, h, lo, a.String()+"/128")
	}
	c, err := nftutil.Conn(ns)
	if err != nil {
		t.Fatal(err)
	}
	b := &bed{t: t, ns: ns, f: New(c, ""), recv: map[bool]*net.UDPConn{}, conn: c}
	for _, a := range []netip.Addr{host, host6} {
		var l *net.UDPConn
		err := testns.Do(ns, func() (err error) {
			l, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, port)))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		b.recv[a.Is6()] = l
	}
	return b
}

// send sends one VXLAN-shaped datagram of vni from src to the host's
// address of src's family, and reports whether it arrived within wait.
// Each carries a number of its own: a late one of an earlier send is
// skipped.
func (b *bed) send(src netip.Addr, vni uint32, wait time.Duration) bool {
	b.t.Helper()
	dst := host
	if src.Is6() {
		dst = host6
	}
	b.seq++
	msg := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0, b.seq}
	err := testns.Do(b.ns, func() error {
		c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)),
			net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(msg)
		return err
	})
	if err != nil {
		b.t.Fatal(err)
	}
	l := b.recv[src.Is6()]
	buf := make([]byte, 64)
	l.SetReadDeadline(time.Now().Add(wait))
	for {
		n, from, err := l.ReadFromUDPAddrPort(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
		if err != nil {
			b.t.Fatal(err)
		}
		if n == len(msg) && buf[n-1] != b.seq {
			continue // an earlier send's, late
		}
		if from.Addr().Unmap() != src || n != len(msg) {
			b.t.Fatalf("got %d bytes from %v, want %d from %v", n, from, len(msg), src)
		}
		return true
	}
}

func (b *bed) status() Status {
	b.t.Helper()
	st, err := b.f.Status()
	if err != nil {
		b.t.Fatal(err)
	}
	return st
}

// expect sends a datagram and checks its fate: one that should arrive
// has seconds to (a loaded machine under the race detector is slow), one
// that should be dropped is given a moment to arrive all the same.
func (b *bed) expect(src netip.Addr, vni uint32, admitted bool) {
	b.t.Helper()
	wait := 300 * time.Millisecond
	if admitted {
		wait = 5 * time.Second
	}
	if got := b.send(src, vni, wait); got != admitted {
		b.t.Fatalf("VNI %d from %v: admitted %v, want %v (status %+v)", vni, src, got, admitted, b.status())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestAdmitsMembersOnly(t *testing.T) {
	b := newBed(t)
	const vni, other = 4100, 4200
	// Nothing filtered yet: no table, everything passes.
	b.expect(outsider, vni, true)
	must(t, b.f.AddVNI(vni))
	if st := b.status(); st.Present {
		t.Fatalf("table before the port is known: %+v", st)
	}
	must(t, b.f.SetPort(port))
	must(t, b.f.SetMembers([]netip.Addr{member, member6}))
	b.expect(member, vni, true)
	b.expect(member6, vni, true)
	b.expect(outsider, vni, false)
	b.expect(outside6, vni, false)
	b.expect(outsider, other, true) // not the plugin's VNI: untouched
	if st := b.status(); st.Dropped != 2 || st.DroppedByVNI[vni] != 2 || !st.Intact || !slices.Equal(st.VNIs, []uint32{vni}) {
		t.Fatalf("status %+v, want 2 dropped (both of VNI %d), intact", st, vni)
	}
	// Each network's count is its own.
	must(t, b.f.AddVNI(other))
	b.expect(outsider, other, false)
	if st := b.status(); st.Dropped != 3 || st.DroppedByVNI[vni] != 2 || st.DroppedByVNI[other] != 1 {
		t.Fatalf("status %+v, want 3 dropped: 2 of VNI %d, 1 of %d", st, vni, other)
	}
	must(t, b.f.RemoveVNI(other))
	// A remote endpoint's reference admits a source that is no member.
	must(t, b.f.AddRemote(outsider))
	must(t, b.f.AddRemote(outsider))
	b.expect(outsider, vni, true)
	must(t, b.f.RemoveRemote(outsider))
	b.expect(outsider, vni, true)
	must(t, b.f.RemoveRemote(outsider))
	b.expect(outsider, vni, false)
	// A member that leaves is dropped.
	must(t, b.f.SetMembers([]netip.Addr{member6}))
	b.expect(member, vni, false)
	// The last VNI takes the table with it.
	must(t, b.f.RemoveVNI(vni))
	if st := b.status(); st.Present {
		t.Fatalf("table after the last VNI: %+v", st)
	}
	b.expect(outsider, vni, true)
}

func TestKeepAdmitsUntilReleased(t *testing.T) {
	b := newBed(t)
	const vni = 4100
	must(t, b.f.SetPort(port))
	must(t, b.f.AddVNI(vni))
	must(t, b.f.AddRemote(member))
	// A new run in the same namespace: what the old one admitted stays
	// admitted, with no gap, until released.
	next := New(b.conn, "")
	b.f = next
	nv, na, err := next.Keep()
	must(t, err)
	if nv != 1 || na != 1 {
		t.Fatalf("kept %d VNIs and %d sources, want 1 and 1", nv, na)
	}
	b.expect(member, vni, true)
	b.expect(outsider, vni, false)
	must(t, next.SetPort(port)) // same port: no rebuild needed
	must(t, next.AddVNI(vni))
	b.expect(member, vni, true)
	must(t, next.ReleaseInherited())
	b.expect(member, vni, false)
	must(t, next.Close())
	if st := b.status(); st.Present {
		t.Fatalf("table after Close: %+v", st)
	}
}

func TestRepairRebuildsAFlushedTable(t *testing.T) {
	b := newBed(t)
	const vni = 4100
	must(t, b.f.SetPort(port))
	must(t, b.f.AddVNI(vni))
	must(t, b.f.SetMembers([]netip.Addr{member}))
	// From outside: the table goes (nft flush ruleset, or delete table).
	b.conn.DelTable(b.f.table)
	must(t, b.conn.Flush())
	if st := b.status(); st.Intact {
		t.Fatalf("status intact after the table went: %+v", st)
	}
	must(t, b.f.Repair())
	b.expect(outsider, vni, false)
	b.expect(member, vni, true)
	// A change after another outside removal rebuilds at once.
	b.conn.DelTable(b.f.table)
	must(t, b.conn.Flush())
	must(t, b.f.AddRemote(outside6))
	b.expect(outsider, vni, false)
	b.expect(outside6, vni, true)
	if st := b.status(); !st.Intact {
		t.Fatalf("not intact after the rebuild: %+v", st)
	}
}

func TestBadInputLeavesTheTable(t *testing.T) {
	f := New(nil, "unused")
	for _, err := range []error{f.AddVNI(0), f.AddVNI(1 << 24), f.AddRemote(netip.Addr{}), f.SetPort(0)} {
		if err == nil {
			t.Error("bad input accepted")
		}
	}
	if len(f.b.vnis)+len(f.b.refs) != 0 {
		t.Fatalf("books changed: %+v", f.b)
	}
}

func TestDiff(t *testing.T) {
	add, del := diff([]uint32{1, 3, 5}, []uint32{2, 3, 6}, func(a, b uint32) int { return int(a) - int(b) })
	if !slices.Equal(add, []uint32{1, 5}) || !slices.Equal(del, []uint32{2, 6}) {
		t.Fatalf("diff = %v, %v", add, del)
	}
}
