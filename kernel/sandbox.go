package kernel

// Sandboxes: building, removing and listing them.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
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

// CreateSandbox implements Kernel.
func (n *Netlink) CreateSandbox(spec SandboxSpec) (retErr error) {
	if err := checkName(spec.Name); err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	if spec.VNI == 0 || spec.VNI >= 1<<24 {
		return fmt.Errorf("create sandbox %q: VNI %d out of range 1..16777215", spec.Name, spec.VNI)
	}
	if spec.Port == 0 {
		return fmt.Errorf("create sandbox %q: UDP port must be set", spec.Name)
	}
	if !spec.Local.IsValid() || spec.Local.IsUnspecified() {
		return fmt.Errorf("create sandbox %q: invalid local VTEP address %v", spec.Name, spec.Local)
	}
	local := spec.Local.Unmap()

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
	var tmpVXLAN netlink.Link // set while the VXLAN device is in the host namespace
	defer func() {
		if retErr == nil {
			return
		}
		var errs []error
		if tmpVXLAN != nil {
			if err := n.host.LinkDel(tmpVXLAN); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete %s: %w", tmpVXLAN.Attrs().Name, err))
			}
		}
		if err := n.destroy(spec.Name, sb); err != nil {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			retErr = fmt.Errorf("%w (cleanup failed too: %w)", retErr, errors.Join(errs...))
		}
	}()
	fail := func(what string, err error) error {
		return fmt.Errorf("create sandbox %q: %s: %w", spec.Name, what, classifyExists(err))
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

	br := &netlink.Bridge{LinkAttrs: attrs(BridgeName, spec.MTU)}
	if err := sb.h.LinkAdd(br); err != nil {
		return fail(fmt.Sprintf("create bridge %s (MTU %d)", BridgeName, spec.MTU), err)
	}
	if err := sb.h.LinkSetUp(br); err != nil {
		return fail("set "+BridgeName+" up", err)
	}

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
		return fail(fmt.Sprintf("create VXLAN device %s (VNI %d, port %d, local %s, MTU %d) in host namespace",
			tmpName, spec.VNI, spec.Port, local, spec.MTU), err)
	}
	tmpVXLAN = vx
	if err := n.host.LinkSetNsFd(vx, sb.fd); err != nil {
		return fail("move "+tmpName+" into sandbox namespace", err)
	}
	tmpVXLAN = nil // now in the sandbox: destroy removes it

	moved, err := sb.h.LinkByName(tmpName)
	if err != nil {
		return fail("find "+tmpName+" in sandbox", err)
	}
	if err := sb.h.LinkSetName(moved, VXLANName); err != nil {
		return fail("rename "+tmpName+" to "+VXLANName, err)
	}
	if err := sb.h.LinkSetMasterByIndex(moved, br.Attrs().Index); err != nil {
		return fail("enslave "+VXLANName+" to "+BridgeName, err)
	}
	if err := sb.h.LinkSetUp(moved); err != nil {
		return fail("set "+VXLANName+" up", err)
	}
	sb.vxlanIndex.Store(int32(moved.Attrs().Index))
	n.insert(spec.Name, sb, 1)
	return nil
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
