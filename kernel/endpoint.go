package kernel

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// OpenEndpoint makes the bridge of sandbox an endpoint of its own network
// (the health prober's): it takes mac and addr, everything is routed
// through it, and a UDP socket bound to addr:port inside the sandbox is
// returned. What the socket sends carries DF and is never fragmented
// locally, whatever the path MTU cache says, so a probe's size is what
// crosses. Calling it again on the same sandbox fails (the address exists).
func (n *Netlink) OpenEndpoint(sandboxName string, mac hwaddr.MAC, addr netip.Addr, port uint16) (*net.UDPConn, error) {
	sb, err := n.sandbox(sandboxName)
	if err != nil {
		return nil, fmt.Errorf("endpoint in sandbox %q: %w", sandboxName, err)
	}
	defer n.release(sb)
	fail := func(what string, err error) (*net.UDPConn, error) {
		return nil, fmt.Errorf("endpoint in sandbox %q: %s: %w", sandboxName, what, classifyExists(err))
	}
	br, err := sb.h.LinkByName(BridgeName)
	if err != nil {
		return fail("find bridge", classify(err))
	}
	if err := sb.h.LinkSetHardwareAddr(br, mac.HardwareAddr()); err != nil {
		return fail("set MAC", err)
	}
	a := &netlink.Addr{IPNet: netlink.NewIPNet(addr.AsSlice())}
	if addr.Is6() {
		a.Flags = unix.IFA_F_NODAD // no peer owns our VTEP's address in here
	}
	if err := sb.h.AddrAdd(br, a); err != nil {
		return fail("add address", err)
	}
	dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if addr.Is6() {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	if err := sb.h.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
		return fail("add route", err)
	}
	var c *net.UDPConn
	err = nsthread.Do(netns.NsHandle(sb.fd), func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		return err
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return fail("open socket", err)
	}
	if err := probeFlags(c, addr.Is6()); err != nil {
		c.Close()
		return fail("set DF", err)
	}
	return c, nil
}

// probeFlags sets DF on what c sends and keeps the kernel from
// fragmenting it or shrinking it to a cached path MTU.
func probeFlags(c *net.UDPConn, v6 bool) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1)
			}
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
	})
	if err != nil {
		return err
	}
	return serr
}
