package testbed

import (
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
	"github.com/overlay-plugin/overlay-plugin/internal/testns"
)

// TestNftables: the nftables readers and the port cut, in a throwaway
// namespace, with no nft command: the cut drops UDP to its port (and
// nothing else), the counter sums what a chain counted.
func TestNftables(t *testing.T) {
	ns := testns.New(t)
	path := testns.Publish(t, ns, "testbed-nft")
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	testns.SetUp(t, h, "lo")

	// A table of ours with a counting input chain, as the plugin's.
	c, err := nftutil.Conn(ns)
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(&nftables.Table{Name: "counted", Family: nftables.TableFamilyINet})
	prio := nftables.ChainPriority(0)
	ch := c.AddChain(&nftables.Chain{Table: tb, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: &prio})
	c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Counter{}}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := NftPackets(path, "counted", "none"); err == nil {
		t.Error("NftPackets of a missing chain succeeded")
	}

	const cut, open = 7947, 7948
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(NftDropPort(path, "cut", cut))
	tables, err := NftTables(path)
	must(err)
	if !slices.Equal(tables, []string{"inet counted", "inet cut"}) {
		t.Errorf("NftTables = %v, want [inet counted inet cut]", tables)
	}
	// received reports whether a datagram sent to port on lo arrives.
	received := func(port int) bool {
		t.Helper()
		var got bool
		must(testns.Do(ns, func() error {
			srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
			if err != nil {
				return err
			}
			defer srv.Close()
			cl, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
			if err != nil {
				return err
			}
			defer cl.Close()
			if _, err := cl.Write([]byte("x")); errors.Is(err, unix.EPERM) {
				return nil // dropped on the way out
			} else if err != nil {
				return err
			}
			_ = srv.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err = srv.Read(make([]byte, 1))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			got = err == nil
			return err
		}))
		return got
	}
	if received(cut) {
		t.Errorf("a datagram to port %d passed the cut", cut)
	}
	if !received(open) {
		t.Errorf("a datagram to port %d did not arrive", open)
	}
	must(DelNftTable(path, "cut"))
	if !received(cut) {
		t.Errorf("a datagram to port %d did not arrive after the cut was removed", cut)
	}
	if n, err := NftPackets(path, "counted", "input"); err != nil || n < 2 {
		t.Errorf("NftPackets = %d, %v; want the 2 datagrams that arrived", n, err)
	}
}
