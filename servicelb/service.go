package servicelb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// ErrInvalid marks input that Apply refuses; nothing is changed then.
var ErrInvalid = errors.New("invalid service")

// Service is one virtual IP and its backends as a client sandbox must see
// them.
type Service struct {
	// Name labels the service in the rules' comments and in errors.
	Name string
	// VIP is the address the service name resolves to.
	VIP netip.Addr
	// Backends are the addresses of the service's tasks, of VIP's family.
	// Order and duplicates do not matter. None: connections to VIP are
	// refused.
	Backends []netip.Addr
}

// Backend identifies one backend of one service.
type Backend struct {
	VIP, Addr netip.Addr
}

func (b Backend) String() string { return b.VIP.String() + "->" + b.Addr.String() }

// checkAddr refuses what cannot be a VIP or a task address: the zero
// Addr, zoned or IPv4-mapped addresses (ambiguous family), unspecified,
// loopback and multicast addresses.
func checkAddr(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return errors.New("no address")
	case a.Zone() != "":
		return fmt.Errorf("%s has a zone", a)
	case a.Is4In6():
		return fmt.Errorf("%s is IPv4-mapped: use the IPv4 address", a)
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast():
		return fmt.Errorf("%s is unspecified, loopback or multicast", a)
	}
	return nil
}

func invalid(svc Service, format string, args ...any) error {
	return fmt.Errorf("servicelb: service %q (VIP %s): %s: %w", svc.Name, svc.VIP, fmt.Sprintf(format, args...), ErrInvalid)
}

// Normalize checks svcs and returns them in canonical form: sorted by VIP,
// each one's backends sorted and deduplicated, nothing shared with svcs.
// Equal inputs (up to order and duplicate backends) give equal outputs,
// hence identical rules. It refuses, with an error wrapping ErrInvalid, a
// VIP or backend that checkAddr refuses, a backend of the other family, a
// VIP given twice, and an address that is both a VIP and a backend.
func Normalize(svcs []Service) ([]Service, error) {
	out := make([]Service, 0, len(svcs))
	vips := make(map[netip.Addr]bool, len(svcs))
	for _, s := range svcs {
		if err := checkAddr(s.VIP); err != nil {
			return nil, invalid(s, "bad VIP: %v", err)
		}
		if vips[s.VIP] {
			return nil, invalid(s, "VIP given twice")
		}
		vips[s.VIP] = true
		n := Service{Name: s.Name, VIP: s.VIP, Backends: slices.Clone(s.Backends)}
		for _, b := range n.Backends {
			if err := checkAddr(b); err != nil {
				return nil, invalid(s, "bad backend: %v", err)
			}
			if b.Is4() != s.VIP.Is4() {
				return nil, invalid(s, "backend %s is not of the VIP's family", b)
			}
		}
		slices.SortFunc(n.Backends, netip.Addr.Compare)
		if n.Backends = slices.Compact(n.Backends); len(n.Backends) == 0 {
			n.Backends = nil
		}
		out = append(out, n)
	}
	for _, s := range out {
		for _, b := range s.Backends {
			if vips[b] {
				return nil, invalid(s, "backend %s is a VIP", b)
			}
		}
	}
	slices.SortFunc(out, func(a, b Service) int { return a.VIP.Compare(b.VIP) })
	return out, nil
}
