package kernelpath

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// vxlanDevs is the reference systems' set-up: one VXLAN device per
// network in the worker's namespace, made as the plugin makes its own.
type vxlanDevs struct{ idx []int }

func (v *vxlanDevs) setup(networks int) error {
	for k := range networks {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("vx%d", k), MTU: 1450},
			VxlanId: int(vniOf(k)), Port: 4789, SrcAddr: net.ParseIP(localVTEP), Learning: false, Proxy: true}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(vx); err != nil {
			return err
		}
		v.idx = append(v.idx, vx.Attrs().Index)
	}
	return nil
}

func (v *vxlanDevs) count(k int) (int, int, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return 0, 0, err
	}
	defer h.Close()
	return countEntries(h, v.idx[k])
}

// raw is the synchronous loop: per peer a neighbour and an FDB replace,
// each a netlink round trip (vishvananda/netlink, a handle per network).
type raw struct {
	vxlanDevs
	in [][]netlink.Neigh
}

func (r *raw) prepare(k int, peers []peer) error {
	var in []netlink.Neigh
	for _, p := range peers {
		in = append(in,
			netlink.Neigh{LinkIndex: r.idx[k], Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: p.ip.AsSlice(), HardwareAddr: p.mac.HardwareAddr()},
			netlink.Neigh{LinkIndex: r.idx[k], Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
				IP: p.vtep.AsSlice(), HardwareAddr: p.mac.HardwareAddr()})
	}
	r.in = append(r.in, in)
	return nil
}

func (r *raw) program(k int) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	for i := range r.in[k] {
		if err := h.NeighSet(&r.in[k][i]); err != nil {
			return err
		}
	}
	return nil
}

func (r *raw) close() {}

// batch is iproute2's batch mode: `ip -batch` with a neigh replace per
// peer and `bridge -batch` with an fdb replace per peer, one after the
// other, per network.
type batch struct {
	vxlanDevs
	files [][2]string
}

func (b *batch) prepare(k int, peers []peer) error {
	var ip, br bytes.Buffer
	for _, p := range peers {
		fmt.Fprintf(&ip, "neigh replace %s lladdr %s dev vx%d nud permanent\n", p.ip, p.mac, k)
		fmt.Fprintf(&br, "fdb replace %s dev vx%d dst %s self permanent\n", p.mac, k, p.vtep)
	}
	f := [2]string{filepath.Join("/run/overlay-bench", fmt.Sprintf("ip%d", k)), filepath.Join("/run/overlay-bench", fmt.Sprintf("br%d", k))}
	if err := os.WriteFile(f[0], ip.Bytes(), 0o644); err != nil {
		return err
	}
	b.files = append(b.files, f)
	return os.WriteFile(f[1], br.Bytes(), 0o644)
}

func (b *batch) program(k int) error {
	for i, tool := range []string{"ip", "bridge"} {
		if out, err := exec.Command(tool, "-batch", b.files[k][i]).CombinedOutput(); err != nil {
			return fmt.Errorf("%s -batch: %w: %s", tool, err, out)
		}
	}
	return nil
}

func (b *batch) close() {}
