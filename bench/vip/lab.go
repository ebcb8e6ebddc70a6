package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// The lab's addresses (RFC 2544's benchmark range, never routed outside
// the lab's namespaces): the clients on one bridge in the backend
// namespace, which owns every address of tasks as local (one route), and
// the VIPs, which only the clients' own nat rules ever see.
const (
	gatewayCIDR = "198.18.0.1/16" // the bridge's: the clients' default route
	firstVIP4   = "198.18.128.0"  // service 0's; the next service's is the next
	tasksCIDR   = "198.19.0.0/16"
)

var (
	gateway, tasksRange = netip.MustParsePrefix(gatewayCIDR), netip.MustParsePrefix(tasksCIDR)
	firstVIP            = netip.MustParseAddr(firstVIP4)
)

// port is where the backend namespace answers every task address.
const port = 7000

// lab is a backend namespace and client namespaces, each with its
// namespace file (what servicelb is given, as Docker's SandboxKey), all
// in a temporary directory; close removes every one of them.
type lab struct {
	dir     string
	backend netns.NsHandle
	beH     *netlink.Handle
	ln      net.Listener
	clients []client
}

type client struct {
	ns   netns.NsHandle
	path string
}

// newLab makes the backend namespace and n clients. Nothing is added to
// the namespace the process runs in.
func newLab(n int) (l *lab, err error) {
	l = &lab{backend: netns.None()}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	if l.dir, err = os.MkdirTemp("", "vipbench"); err != nil {
		return nil, err
	}
	if l.backend, err = nsthread.New(); err != nil {
		return nil, err
	}
	if l.beH, err = nsthread.Open(l.backend, newHandle); err != nil {
		return nil, err
	}
	br, err := l.backendLinks()
	if err != nil {
		return nil, err
	}
	if err := nsthread.Do(l.backend, func() (err error) {
		l.ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	}); err != nil {
		return nil, fmt.Errorf("listen in the backend namespace: %w", err)
	}
	go serve(l.ln)
	for i := range n {
		if err := l.addClient(i, br); err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
	}
	return l, nil
}

// backendLinks sets up the backend namespace: lo, the bridge with the
// clients' gateway, and every task address local.
func (l *lab) backendLinks() (netlink.Link, error) {
	lo, err := l.beH.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "vipbr"}}
	if err := l.beH.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	local := &netlink.Route{Dst: ipNet(tasksRange), LinkIndex: lo.Attrs().Index, Type: unix.RTN_LOCAL,
		Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST}
	err = errors.Join(l.beH.LinkSetUp(lo), l.beH.LinkSetUp(br), l.beH.AddrAdd(br, &netlink.Addr{IPNet: ipNet(gateway)}),
		l.beH.RouteAdd(local))
	return br, err
}

// addClient makes client i: a namespace with a veth on the bridge, an
// address, and a default route through the gateway.
func (l *lab) addClient(i int, br netlink.Link) error {
	ns, err := nsthread.New()
	if err != nil {
		return err
	}
	c := client{ns: ns, path: filepath.Join(l.dir, fmt.Sprintf("vipc%d", i))}
	l.clients = append(l.clients, c)
	if err := os.WriteFile(c.path, nil, 0o600); err != nil {
		return err
	}
	if err := nsthread.Mount(ns, c.path); err != nil {
		os.Remove(c.path)
		return err
	}
	name := fmt.Sprintf("vipc%d", i)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("vipb%d", i), MasterIndex: br.Attrs().Index},
		PeerName: name, PeerNamespace: netlink.NsFd(int(ns))}
	if err := l.beH.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	if err := l.beH.LinkSetUp(veth); err != nil {
		return err
	}
	h, err := nsthread.Open(ns, newHandle)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	eth, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(1 + i/250), byte(1 + i%250)}), gateway.Bits())
	return errors.Join(h.LinkSetUp(lo), h.LinkSetUp(eth), h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(addr)}),
		h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gateway.Addr().AsSlice()}))
}

// close removes the clients (their namespaces go with their last
// reference: the mount and the handle), the backend namespace with the
// bridge and the veths, and the directory.
func (l *lab) close() {
	if l.ln != nil {
		l.ln.Close()
	}
	for _, c := range l.clients {
		unix.Unmount(c.path, unix.MNT_DETACH)
		c.ns.Close()
	}
	if l.beH != nil {
		l.beH.Close()
	}
	if l.backend.IsOpen() {
		l.backend.Close()
	}
	if l.dir != "" {
		os.RemoveAll(l.dir)
	}
}

func newHandle() (*netlink.Handle, error) { return netlink.NewHandle() }

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
