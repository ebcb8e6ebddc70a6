package kernelpath

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/log"
	"github.com/gogo/protobuf/proto"
	"github.com/moby/moby/v2/daemon/libnetwork/discoverapi"
	"github.com/moby/moby/v2/daemon/libnetwork/driverapi"
	"github.com/moby/moby/v2/daemon/libnetwork/drivers/overlay"
	"github.com/moby/moby/v2/daemon/libnetwork/netlabel"
	"github.com/moby/moby/v2/daemon/libnetwork/types"
	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// moby is Docker's overlay driver (daemon/libnetwork/drivers/overlay),
// driven in-process as libnetwork drives it: DiscoverNew with this node's
// address, CreateNetwork, CreateEndpoint, Join, and a peer as the
// NetworkDB event of its overlay_peer_table entry (EventNotify), one per
// peer as NetworkDB delivers them.
type moby struct {
	d  driverapi.Driver
	tw driverapi.TableWatcher
	in [][][]byte
}

type registerer struct{ d driverapi.Driver }

func (r *registerer) RegisterDriver(_ string, d driverapi.Driver, _ driverapi.Capability) error {
	r.d = d
	return nil
}
func (r *registerer) RegisterNetworkAllocator(string, driverapi.NetworkAllocator) error { return nil }

func newMoby() (*moby, error) {
	logrus.SetOutput(io.Discard)
	_ = log.SetLevel("panic")
	var r registerer
	if err := overlay.Register(&r); err != nil {
		return nil, err
	}
	disc := r.d.(discoverapi.Discover)
	if err := disc.DiscoverNew(discoverapi.NodeDiscovery, discoverapi.NodeDiscoveryData{Address: localVTEP, BindAddress: localVTEP, Self: true}); err != nil {
		return nil, err
	}
	return &moby{d: r.d, tw: r.d.(driverapi.TableWatcher)}, nil
}

func (m *moby) createNetwork(k int) error {
	pool, gw := subnet(k), netip.PrefixFrom(gateway(k), 16)
	return m.d.CreateNetwork(context.Background(), netID(k),
		map[string]any{netlabel.GenericData: map[string]string{netlabel.OverlayVxlanIDList: fmt.Sprint(vniOf(k))}}, nil,
		[]driverapi.IPAMData{{Pool: ipnet(pool), Gateway: ipnet(gw)}}, nil)
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func (m *moby) join(k, j int) error {
	eid := localID(k, j)
	ctx := context.Background()
	ifc := &ifInfo{addr: ipnet(netip.PrefixFrom(localAddr(k, j), 16))}
	if err := m.d.CreateEndpoint(ctx, netID(k), eid, ifc, nil); err != nil {
		return err
	}
	return m.d.Join(ctx, netID(k), eid, fmt.Sprintf("/var/run/docker/netns/c%d-%d", k, j), joinInfo{}, nil, nil)
}

func (m *moby) leave(k, j int) error {
	eid := localID(k, j)
	if err := m.d.Leave(netID(k), eid); err != nil {
		return err
	}
	return m.d.DeleteEndpoint(netID(k), eid)
}

func (m *moby) setup(networks int) error {
	for k := range networks {
		if err := m.createNetwork(k); err != nil {
			return err
		}
		if err := m.join(k, 0); err != nil {
			return err
		}
	}
	return nil
}

func (m *moby) prepare(k int, peers []peer) error {
	in := make([][]byte, len(peers))
	for i, p := range peers {
		b, err := proto.Marshal(&overlay.PeerRecord{EndpointIP: netip.PrefixFrom(p.ip, 16).String(),
			EndpointMAC: p.mac.String(), TunnelEndpointIP: p.vtep.String()})
		if err != nil {
			return err
		}
		in[i] = b
	}
	m.in = append(m.in, in)
	return nil
}

func (m *moby) program(k int) error {
	for i, v := range m.in[k] {
		m.tw.EventNotify(netID(k), overlay.OverlayPeerTable, epID(k, i), nil, v)
	}
	return nil
}

// count finds network k's VXLAN device (by VNI) in moby's sandbox
// namespaces under /var/run/docker/netns.
func (m *moby) count(k int) (int, int, error) {
	paths, _ := filepath.Glob("/var/run/docker/netns/*")
	for _, p := range paths {
		if !strings.Contains(filepath.Base(p), netID(k)[:10]) {
			continue
		}
		ns, err := netns.GetFromPath(p)
		if err != nil {
			return 0, 0, err
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		if err != nil {
			return 0, 0, err
		}
		defer h.Close()
		links, err := h.LinkList()
		if err != nil {
			return 0, 0, err
		}
		for _, l := range links {
			if vx, ok := l.(*netlink.Vxlan); ok && vx.VxlanId == int(vniOf(k)) {
				return countEntries(h, l.Attrs().Index)
			}
		}
	}
	return 0, 0, fmt.Errorf("network %d: no VXLAN device with VNI %d in %v", k, vniOf(k), paths)
}

func (m *moby) close() {
	// The namespace and its mounts go with the worker process.
	_ = os.RemoveAll("/var/run/docker/netns")
}

// ifInfo and joinInfo are what libnetwork passes to the driver, reduced to
// what the overlay driver uses.
type ifInfo struct {
	addr *net.IPNet
	mac  net.HardwareAddr
}

func (i *ifInfo) SetMacAddress(m net.HardwareAddr) error { i.mac = m; return nil }
func (i *ifInfo) SetIPAddress(*net.IPNet) error          { return nil }
func (i *ifInfo) MacAddress() net.HardwareAddr           { return i.mac }
func (i *ifInfo) Address() *net.IPNet                    { return i.addr }
func (i *ifInfo) AddressIPv6() *net.IPNet                { return nil }
func (i *ifInfo) NetnsPath() string                      { return "" }
func (i *ifInfo) SetCreatedInContainer(bool)             {}

type joinInfo struct{}

func (joinInfo) InterfaceName() driverapi.InterfaceNameInfo               { return nil }
func (joinInfo) SetGateway(net.IP) error                                  { return nil }
func (joinInfo) SetGatewayIPv6(net.IP) error                              { return nil }
func (joinInfo) AddStaticRoute(*net.IPNet, types.RouteType, net.IP) error { return nil }
func (joinInfo) DisableGatewayService()                                   {}
func (joinInfo) ForceGw4()                                                {}
func (joinInfo) ForceGw6()                                                {}
func (joinInfo) AddTableEntry(string, string, []byte) error               { return nil }
