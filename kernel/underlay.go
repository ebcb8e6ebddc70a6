package kernel

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// Underlay answers questions about the host's own (underlay) network in one
// network namespace: which address to advertise as VTEP when none is
// configured, and the MTU the overlay must fit in.
type Underlay struct {
	h *netlink.Handle
}

// NewUnderlay queries the namespace ns (netns.None() for the caller's).
func NewUnderlay(ns netns.NsHandle) (*Underlay, error) {
	h, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return netlink.NewHandle() })
	if err != nil {
		return nil, fmt.Errorf("netlink handle for underlay: %w", err)
	}
	return &Underlay{h: h}, nil
}

// Close releases the netlink socket.
func (u *Underlay) Close() { u.h.Close() }

// DefaultAddr returns the primary global address of the interface holding
// the IPv4 default route, or failing that the IPv6 one.
func (u *Underlay) DefaultAddr() (netip.Addr, error) {
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := u.h.RouteList(nil, family)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && r.Dst.IP != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			link, err := u.h.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			addrs, err := u.h.AddrList(link, family)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				ip, ok := netip.AddrFromSlice(a.IP)
				if ok && ip.Unmap().IsGlobalUnicast() {
					return ip.Unmap(), nil
				}
			}
		}
	}
	return netip.Addr{}, errors.New("no default route with a global address: set the advertise address explicitly")
}

// MTU returns the MTU of the interface that holds addr.
func (u *Underlay) MTU(addr netip.Addr) (int, error) {
	family := unix.AF_INET
	if addr.Is6() {
		family = unix.AF_INET6
	}
	addrs, err := u.h.AddrList(nil, family)
	if err != nil {
		return 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != addr {
			continue
		}
		link, err := u.h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return 0, fmt.Errorf("link of %s: %w", addr, err)
		}
		return link.Attrs().MTU, nil
	}
	return 0, fmt.Errorf("no interface holds the advertise address %s", addr)
}
