package testbed

import (
	"errors"
	"fmt"
	"net/netip"

	api "github.com/docker/go-plugins-helpers/network"
)

// Container is a namespace standing in for a container on a host. Make it
// before Join (its Path is the SandboxKey), then Attach the interface the
// plugin handed out, as dockerd does.
type Container struct {
	*Netns
	Name string
	Host *Host
	// Endpoint is set by Plugin.RunContainer.
	Endpoint *Endpoint
	// Set by Attach: the interface's name inside the container, the name
	// the plugin gave it in the host namespace, its MAC and addresses.
	Iface   string
	SrcName string
	MAC     string
	Addrs   []netip.Prefix
}

// NewContainer creates the container's namespace.
func (h *Host) NewContainer(name string) (*Container, error) {
	ns, err := h.topo.Bed.NewNetns(name)
	if err != nil {
		return nil, err
	}
	return &Container{Netns: ns, Name: name, Host: h}, nil
}

// RunContainer does what dockerd does to start a container on a network of
// the plugin: a namespace for the container, CreateJoin with its
// SandboxKey, then Attach.
func (p *Plugin) RunContainer(networkID, name string, addrs ...netip.Prefix) (*Container, error) {
	c, err := p.Host.NewContainer(name)
	if err != nil {
		return nil, err
	}
	ep, err := p.CreateJoin(networkID, c.SandboxKey(), addrs...)
	if err != nil {
		return nil, err
	}
	ep.Ctr, c.Endpoint = c, ep
	return c, c.Attach(ep.Join, ep.MAC, addrs...)
}

// SandboxKey is what dockerd passes in Join: the container's netns path.
func (c *Container) SandboxKey() string { return c.Path() }

// Attach does what dockerd does after a successful Join: move the interface
// InterfaceName.SrcName from the host namespace into the container, rename
// it DstPrefix+"0", set mac (if not empty), add the addresses (IPv6 without
// DAD), bring lo and the interface up, and add the StaticRoutes and
// gateways of the Join response.
func (c *Container) Attach(join *api.JoinResponse, mac string, addrs ...netip.Prefix) error {
	if join == nil || join.InterfaceName.SrcName == "" {
		return errors.New("attach: Join response names no interface (InterfaceName.SrcName)")
	}
	if join.InterfaceName.DstPrefix == "" {
		return errors.New("attach: Join response has no InterfaceName.DstPrefix")
	}
	src, dst := join.InterfaceName.SrcName, join.InterfaceName.DstPrefix+"0"
	if _, err := c.Host.NS.IP("link", "set", src, "netns", c.Netns.Name); err != nil {
		return fmt.Errorf("attach %s: move %s from %s: %w", c.Name, src, c.Host.Name, err)
	}
	c.SrcName, c.Iface = src, dst
	steps := [][]string{{"link", "set", src, "name", dst}}
	if mac != "" {
		steps = append(steps, []string{"link", "set", dst, "address", mac})
	}
	for _, a := range addrs {
		s := []string{"addr", "add", a.String(), "dev", dst}
		if a.Addr().Is6() {
			s = append(s, "nodad")
		}
		steps = append(steps, s)
	}
	steps = append(steps, []string{"link", "set", "lo", "up"}, []string{"link", "set", dst, "up"})
	for _, r := range join.StaticRoutes {
		if r == nil {
			continue
		}
		switch r.RouteType {
		case 1: // libnetwork types.CONNECTED
			steps = append(steps, []string{"route", "add", r.Destination, "dev", dst})
		case 0: // types.NEXTHOP
			steps = append(steps, []string{"route", "add", r.Destination, "via", r.NextHop, "dev", dst})
		default:
			return fmt.Errorf("attach %s: static route %+v of unknown type", c.Name, *r)
		}
	}
	if join.Gateway != "" {
		steps = append(steps, []string{"route", "add", "default", "via", join.Gateway, "dev", dst})
	}
	if join.GatewayIPv6 != "" {
		steps = append(steps, []string{"-6", "route", "add", "default", "via", join.GatewayIPv6, "dev", dst})
	}
	for _, s := range steps {
		if _, err := c.IP(s...); err != nil {
			return fmt.Errorf("attach %s: %w", c.Name, err)
		}
	}
	c.MAC, c.Addrs = mac, addrs
	return nil
}

// Detach does what dockerd does before Leave: the interface goes down, gets
// its SrcName back and returns to the host namespace, for the plugin to
// delete.
func (c *Container) Detach() error {
	if c.Iface == "" {
		return errors.New("detach: not attached")
	}
	for _, s := range [][]string{
		{"link", "set", c.Iface, "down"},
		{"link", "set", c.Iface, "name", c.SrcName},
		{"link", "set", c.SrcName, "netns", c.Host.NS.Name},
	} {
		if _, err := c.IP(s...); err != nil {
			return fmt.Errorf("detach %s: %w", c.Name, err)
		}
	}
	c.Iface = ""
	return nil
}

// Addr returns the container's address of the family, if it has one.
func (c *Container) Addr(f Family) (netip.Addr, bool) { return addrOf(c.Addrs, f) }
