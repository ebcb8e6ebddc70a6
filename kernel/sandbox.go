package kernel

// Sandboxes: building, removing and listing them.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/overlay-plugin/overlay-plugin/internal/netlinkutil"
)

// deleteLinks deletes every device in the sandbox except lo: VXLANName
// first, so its VNI and UDP port are released at once (namespace teardown
// is asynchronous), then the bridge and the veths (which takes their host
// or container ends with them).
func (sb *sandbox) deleteLinks() error {
	links, err := netlinkutil.Dump(sb.h.LinkList)
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	del := func(l netlink.Link) {
		if err := sb.h.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
		}
	}
	for _, l := range links {
		if l.Attrs().Name == VXLANName {
			del(l)
		}
	}
	for _, l := range links {
		if l.Attrs().Name == VXLANName || l.Attrs().Flags&net.FlagLoopback != 0 {
			continue
		}
		del(l)
	}
	sb.vxlanIndex.Store(0)
	return errors.Join(errs...)
}

// destroy tears down the sandbox mounted at path: its links (through sb,
// or a freshly opened handle when sb is nil), the mount and the file. It
// goes as far as it can and reports every failure.
func (n *Netlink) destroy(name string, sb *sandbox) error {
	path := n.path(name)
	var errs []error
	if sb == nil {
		var err error
		sb, err = openSandbox(name, path)
		if err != nil && !errors.Is(err, errNotNetns) && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if sb != nil {
		if err := sb.deleteLinks(); err != nil {
			errs = append(errs, err)
		}
		sb.close()
	}
	if err := unmountAll(path); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func attrs(name string, mtu int) netlink.LinkAttrs {
	a := netlink.NewLinkAttrs()
	a.Name = name
	a.MTU = mtu
	return a
}

// checkSpec validates spec and returns its local address, unmapped.
func checkSpec(spec SandboxSpec) (netip.Addr, error) {
	if err := checkName(spec.Name); err != nil {
		return netip.Addr{}, err
	}
	if spec.VNI == 0 || spec.VNI >= 1<<24 {
		return netip.Addr{}, fmt.Errorf("sandbox %q: VNI %d out of range 1..16777215", spec.Name, spec.VNI)
	}
	if spec.Port == 0 {
		return netip.Addr{}, fmt.Errorf("sandbox %q: UDP port must be set", spec.Name)
	}
	if !spec.Local.IsValid() || spec.Local.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("sandbox %q: invalid local VTEP address %v", spec.Name, spec.Local)
	}
	return spec.Local.Unmap(), nil
}

// CreateSandbox implements Kernel.
func (n *Netlink) CreateSandbox(spec SandboxSpec) (retErr error) {
	local, err := checkSpec(spec)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}

	path := n.path(spec.Name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create sandbox %q: %w", spec.Name, ErrExists)
		}
		return fmt.Errorf("create sandbox %q: create mount point: %w", spec.Name, err)
	}
	f.Close()
	// A stale cache entry cannot survive: the file did not exist.
	n.uncache(spec.Name)

	var sb *sandbox
	defer func() {
		if retErr == nil {
			return
		}
		if err := n.destroy(spec.Name, sb); err != nil {
			retErr = fmt.Errorf("%w (cleanup failed too: %w)", retErr, err)
		}
	}()
	fail := func(what string, err error) error {
		if what != "" {
			err = fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("create sandbox %q: %w", spec.Name, classifyExists(err))
	}

	if err := newNamespace(path); err != nil {
		return fail("create namespace", err)
	}
	sb, err = openSandbox(spec.Name, path)
	if err != nil {
		return fail("open namespace", err)
	}

	lo, err := sb.h.LinkByName("lo")
	if err != nil {
		return fail("find lo", err)
	}
	if err := sb.h.LinkSetUp(lo); err != nil {
		return fail("set lo up", err)
	}
	br, err := sb.addBridge(spec.MTU)
	if err != nil {
		return fail("", err)
	}
	if err := n.addVXLAN(sb, spec, local, br.Attrs().Index); err != nil {
		return fail("", err)
	}
	n.insert(spec.Name, sb, 1)
	return nil
}

// addBridge creates BridgeName in the sandbox and sets it up.
func (sb *sandbox) addBridge(mtu int) (netlink.Link, error) {
	br := &netlink.Bridge{LinkAttrs: attrs(BridgeName, mtu)}
	if err := sb.h.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("create bridge %s (MTU %d): %w", BridgeName, mtu, err)
	}
	if err := sb.h.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("set %s up: %w", BridgeName, err)
	}
	return br, nil
}

// addVXLAN creates VXLANName in the host namespace, so that its UDP socket
// stays there, moves it into the sandbox, enslaves it to the bridge with
// ifindex brIndex and sets it up. A device still in the host namespace
// when a step fails is deleted; one in the sandbox under its temporary
// name is left for destroy or RepairSandbox.
func (n *Netlink) addVXLAN(sb *sandbox, spec SandboxSpec, local netip.Addr, brIndex int) (retErr error) {
	tmpName := fmt.Sprintf("%s%06x%05x", HostVXLANPrefix, spec.VNI, n.seq.Add(1)&0xfffff)
	vx := &netlink.Vxlan{
		LinkAttrs: attrs(tmpName, spec.MTU),
		VxlanId:   int(spec.VNI),
		Port:      int(spec.Port),
		SrcAddr:   net.IP(local.AsSlice()),
		Learning:  false,
		Proxy:     true,
	}
	if err := n.host.LinkAdd(vx); err != nil {
		return fmt.Errorf("create VXLAN device %s (VNI %d, port %d, local %s, MTU %d) in host namespace: %w",
			tmpName, spec.VNI, spec.Port, local, spec.MTU, err)
	}
	if err := n.host.LinkSetNsFd(vx, sb.fd); err != nil {
		if derr := n.host.LinkDel(vx); derr != nil && !isNotFound(derr) {
			err = fmt.Errorf("%w (cleanup failed too: delete %s: %w)", err, tmpName, derr)
		}
		return fmt.Errorf("move %s into sandbox namespace: %w", tmpName, err)
	}
	moved, err := sb.h.LinkByName(tmpName)
	if err != nil {
		return fmt.Errorf("find %s in sandbox: %w", tmpName, err)
	}
	if err := sb.h.LinkSetName(moved, VXLANName); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmpName, VXLANName, err)
	}
	if err := sb.h.LinkSetMasterByIndex(moved, brIndex); err != nil {
		return fmt.Errorf("enslave %s to %s: %w", VXLANName, BridgeName, err)
	}
	if err := sb.h.LinkSetUp(moved); err != nil {
		return fmt.Errorf("set %s up: %w", VXLANName, err)
	}
	sb.vxlanIndex.Store(int32(moved.Attrs().Index))
	return nil
}

// checkSandbox says whether the sandbox's namespace is alive: nil, or
// ErrNotFound when it is gone (no mount, or a mount whose namespace died
// with a previous run). Its devices are not looked at.
func (n *Netlink) checkSandbox(name string) error {
	sb, err := n.sandbox(name)
	if errors.Is(err, errNotNetns) {
		return fmt.Errorf("sandbox %q: its namespace is gone (%w): %w", name, err, ErrNotFound)
	}
	if err != nil {
		return err
	}
	n.release(sb)
	return nil
}

// RepairSandbox implements Kernel.
func (n *Netlink) RepairSandbox(spec SandboxSpec) (repairs []Repair, retErr error) {
	local, err := checkSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("repair sandbox: %w", err)
	}
	if err := n.checkSandbox(spec.Name); err != nil {
		return nil, fmt.Errorf("repair sandbox: %w", err)
	}
	sb, err := n.sandbox(spec.Name)
	if err != nil {
		return nil, fmt.Errorf("repair sandbox: %w", err)
	}
	defer n.release(sb)
	defer func() {
		if retErr != nil {
			retErr = fmt.Errorf("repair sandbox %q: %w", spec.Name, retErr)
		}
	}()
	links, err := netlinkutil.Dump(sb.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var br, vx netlink.Link
	var veths []netlink.Link
	for _, l := range links {
		switch name := l.Attrs().Name; {
		case name == BridgeName && l.Type() == "bridge":
			br = l
		case name == VXLANName:
			vx = l
		case strings.HasPrefix(name, HostVXLANPrefix):
			// Half moved in by an earlier repair that failed: its VNI and
			// port would block the new device.
			if err := sb.h.LinkDel(l); err != nil && !isNotFound(err) {
				return repairs, fmt.Errorf("delete leftover %s: %w", name, err)
			}
		case l.Type() == "veth":
			veths = append(veths, l)
		}
	}
	fix := func(l netlink.Link, problem string, do func(netlink.Link) error) error {
		if err := do(l); err != nil {
			return fmt.Errorf("%s %s: %w", l.Attrs().Name, problem, err)
		}
		repairs = append(repairs, Repair{Device: l.Attrs().Name, Problem: problem})
		return nil
	}
	if br == nil {
		if br, err = sb.addBridge(spec.MTU); err != nil {
			return repairs, err
		}
		repairs = append(repairs, Repair{Device: BridgeName, Problem: "missing", Rebuilt: true})
	} else if br.Attrs().Flags&net.FlagUp == 0 {
		if err := fix(br, "down", sb.h.LinkSetUp); err != nil {
			return repairs, err
		}
	}
	brIndex := br.Attrs().Index
	enslave := func(l netlink.Link) error { return sb.h.LinkSetMasterByIndex(l, brIndex) }
	// The containers' ends stay; a new bridge needs them back.
	for _, v := range veths {
		if v.Attrs().MasterIndex != brIndex {
			if err := fix(v, "not on the bridge", enslave); err != nil {
				return repairs, err
			}
		}
	}
	if vx != nil {
		if problem := vxlanMismatch(vx, spec, local); problem != "" {
			if err := sb.h.LinkDel(vx); err != nil && !isNotFound(err) {
				return repairs, fmt.Errorf("delete %s (%s): %w", VXLANName, problem, err)
			}
			sb.vxlanIndex.Store(0)
			if err := n.addVXLAN(sb, spec, local, brIndex); err != nil {
				return repairs, err
			}
			return append(repairs, Repair{Device: VXLANName, Problem: problem, Rebuilt: true}), nil
		}
		if vx.Attrs().MasterIndex != brIndex {
			if err := fix(vx, "not on the bridge", enslave); err != nil {
				return repairs, err
			}
		}
		if vx.Attrs().Flags&net.FlagUp == 0 {
			if err := fix(vx, "down", sb.h.LinkSetUp); err != nil {
				return repairs, err
			}
		}
		sb.vxlanIndex.Store(int32(vx.Attrs().Index))
		return repairs, nil
	}
	sb.vxlanIndex.Store(0)
	if err := n.addVXLAN(sb, spec, local, brIndex); err != nil {
		return repairs, err
	}
	return append(repairs, Repair{Device: VXLANName, Problem: "missing", Rebuilt: true}), nil
}

// vxlanMismatch says how l differs from the VXLAN device CreateSandbox
// makes for spec, or "" when it does not.
func vxlanMismatch(l netlink.Link, spec SandboxSpec, local netip.Addr) string {
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return "a " + l.Type() + ", not a vxlan device"
	}
	src, _ := netip.AddrFromSlice(vx.SrcAddr)
	switch {
	case vx.VxlanId != int(spec.VNI):
		return fmt.Sprintf("VNI %d, not %d", vx.VxlanId, spec.VNI)
	case vx.Port != int(spec.Port):
		return fmt.Sprintf("port %d, not %d", vx.Port, spec.Port)
	case src.Unmap() != local:
		return fmt.Sprintf("local %s, not %s", src.Unmap(), local)
	case vx.Learning || !vx.Proxy:
		return fmt.Sprintf("learning %v and proxy %v, not off and on", vx.Learning, vx.Proxy)
	}
	return ""
}

// DeleteSandbox implements Kernel.
func (n *Netlink) DeleteSandbox(name string) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("delete sandbox: %w", err)
	}
	n.uncache(name)
	if _, err := os.Lstat(n.path(name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("delete sandbox %q: %w", name, ErrNotFound)
		}
		return fmt.Errorf("delete sandbox %q: %w", name, err)
	}
	if err := n.destroy(name, nil); err != nil {
		return fmt.Errorf("delete sandbox %q: %w", name, err)
	}
	return nil
}

// Sandboxes implements Kernel: every file in the sandbox directory.
func (n *Netlink) Sandboxes() ([]string, error) {
	entries, err := os.ReadDir(n.dir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil // ReadDir sorts by name
}

// Inspect implements Kernel. A veth's other end is in the host namespace
// when the link's peer namespace id is the host's as the sandbox numbers
// it (ids are per namespace); any other id is a container's. A missing
// bridge or VXLAN device leaves its part of the spec zero: the reconciler
// rebuilds devices, so only a dead namespace is "not found".
func (n *Netlink) Inspect(name string) (SandboxInfo, error) {
	sb, err := n.sandbox(name)
	if errors.Is(err, errNotNetns) {
		// A mount point whose namespace is gone (with the mount namespace
		// of the run that made it): nothing is there.
		return SandboxInfo{}, fmt.Errorf("inspect: %w: %w", ErrNotFound, err)
	}
	if err != nil {
		return SandboxInfo{}, fmt.Errorf("inspect: %w", err)
	}
	defer n.release(sb)
	// Listing first: the kernel numbers the peer namespaces as it reports
	// them, the host's included.
	links, err := sb.h.LinkList()
	if err != nil {
		return SandboxInfo{}, fmt.Errorf("inspect sandbox %q: list links: %w", name, classify(err))
	}
	hostID, err := sb.h.GetNetNsIdByFd(n.hostNS)
	if err != nil {
		return SandboxInfo{}, fmt.Errorf("inspect sandbox %q: host namespace id: %w", name, err)
	}
	info := SandboxInfo{Spec: SandboxSpec{Name: name}}
	for _, l := range links {
		a := l.Attrs()
		switch v := l.(type) {
		case *netlink.Vxlan:
			if a.Name == VXLANName {
				info.Spec.VNI, info.Spec.Port = uint32(v.VxlanId), uint16(v.Port)
				if ip, ok := netip.AddrFromSlice(v.SrcAddr); ok {
					info.Spec.Local = ip.Unmap()
				}
			}
		case *netlink.Bridge:
			if a.Name == BridgeName {
				info.Spec.MTU = a.MTU
			}
		case *netlink.Veth:
			info.Veths = append(info.Veths, SandboxVeth{Name: a.Name, Attached: a.NetNsID >= 0 && a.NetNsID != hostID})
		}
	}
	return info, nil
}

// RemoveLeftovers implements Kernel.
func (n *Netlink) RemoveLeftovers(keep func(sandbox string) bool) error {
	var errs []error
	names, err := n.Sandboxes()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if keep != nil && keep(name) {
			continue
		}
		n.uncache(name)
		if err := n.destroy(name, nil); err != nil {
			errs = append(errs, fmt.Errorf("remove leftover sandbox %q: %w", name, err))
		}
	}
	links, err := netlinkutil.Dump(n.host.LinkList)
	if err != nil {
		errs = append(errs, fmt.Errorf("remove leftovers: list host links: %w", err))
	}
	for _, l := range links {
		name := l.Attrs().Name
		if !strings.HasPrefix(name, HostVXLANPrefix) && !strings.HasPrefix(name, HostVethPrefix) {
			continue
		}
		// Deleting one end of a veth deletes the other: not found is fine.
		if err := n.host.LinkDel(l); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("remove leftover host link %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
