package servicelb

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// removedBackends lists the backends that have a counter in have (the
// kernel's table) but none in want, sorted.
func removedBackends(have, want *ruleset) []Backend {
	keep := want.counters()
	var out []Backend
	for b := range have.counters() {
		if _, ok := keep[b]; !ok {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(x, y Backend) int {
		if c := x.VIP.Compare(y.VIP); c != 0 {
			return c
		}
		return x.Addr.Compare(y.Addr)
	})
	return out
}

// forgetUDP deletes the conntrack entries of UDP flows from the sandbox to
// a VIP that were balanced to one of removed. A UDP flow has no end the
// kernel could see: as long as the client keeps sending from the same
// port more often than the entry times out (30 s unanswered), conntrack
// would keep it on a backend that may be gone for good. Deleted, its next
// datagram is a new connection, balanced over the current backends (or
// refused). TCP and the rest keep their entries: they end on their own, a
// reset or a timeout, and a removed backend that still answers (a task
// draining) serves its connections to the end.
func forgetUDP(ns netns.NsHandle, removed []Backend) error {
	if len(removed) == 0 {
		return nil
	}
	h, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return netlink.NewHandle() })
	if err != nil {
		return fmt.Errorf("conntrack handle: %w", err)
	}
	defer h.Close()
	filters := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, b := range removed {
		f := &netlink.ConntrackFilter{}
		if err := errors.Join(f.AddProtocol(unix.IPPROTO_UDP),
			f.AddIP(netlink.ConntrackOrigDstIP, b.VIP.AsSlice()),
			f.AddIP(netlink.ConntrackReplySrcIP, b.Addr.AsSlice())); err != nil {
			return fmt.Errorf("conntrack filter for %s: %w", b, err)
		}
		fam := netlink.InetFamily(unix.AF_INET6)
		if b.VIP.Is4() {
			fam = unix.AF_INET
		}
		filters[fam] = append(filters[fam], f)
	}
	for fam, fs := range filters {
		if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, fs...); err != nil {
			return fmt.Errorf("delete UDP conntrack entries to removed backends: %w", err)
		}
	}
	return nil
}
