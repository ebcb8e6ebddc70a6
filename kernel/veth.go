package kernel

// Veths: the containers' interfaces.

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// AddVeth implements Kernel.
func (n *Netlink) AddVeth(sandboxName string, v Veth) (retErr error) {
	sb, err := n.sandbox(sandboxName)
	if err != nil {
		return fmt.Errorf("add veth %s: %w", v.HostName, err)
	}
	defer n.release(sb)
	fail := func(what string, err error) error {
		return fmt.Errorf("add veth %s/%s to sandbox %q: %s: %w", v.HostName, v.SandboxName, sandboxName, what, classifyExists(err))
	}
	veth := &netlink.Veth{
		LinkAttrs:     attrs(v.HostName, v.MTU),
		PeerName:      v.SandboxName,
		PeerTxQLen:    -1,
		PeerNamespace: netlink.NsFd(sb.fd),
	}
	if !v.MAC.IsZero() {
		veth.HardwareAddr = v.MAC.HardwareAddr()
	}
	if err := n.host.LinkAdd(veth); err != nil {
		return fail("create pair", err)
	}
	defer func() {
		if retErr != nil {
			// Deleting the host end deletes the sandbox end too.
			if err := n.host.LinkDel(veth); err != nil && !isNotFound(err) {
				retErr = fmt.Errorf("%w (cleanup failed too: delete %s: %w)", retErr, v.HostName, err)
			}
		}
	}()
	peer, err := sb.h.LinkByName(v.SandboxName)
	if err != nil {
		return fail("find sandbox end", err)
	}
	br, err := sb.h.LinkByName(BridgeName)
	if err != nil {
		return fail("find "+BridgeName, err)
	}
	if err := sb.h.LinkSetMasterByIndex(peer, br.Attrs().Index); err != nil {
		return fail("enslave to "+BridgeName, err)
	}
	if err := sb.h.LinkSetUp(peer); err != nil {
		return fail("set sandbox end up", err)
	}
	return nil
}

// DeleteVeth implements Kernel.
func (n *Netlink) DeleteVeth(sandboxName, vethName string) error {
	sb, err := n.sandbox(sandboxName)
	if err != nil {
		return fmt.Errorf("delete veth %s: %w", vethName, err)
	}
	defer n.release(sb)
	l, err := sb.h.LinkByName(vethName)
	if err != nil {
		return fmt.Errorf("delete veth %s in sandbox %q: %w", vethName, sandboxName, classify(err))
	}
	if l.Type() != "veth" {
		return fmt.Errorf("delete veth %s in sandbox %q: link is a %s, not a veth", vethName, sandboxName, l.Type())
	}
	if err := sb.h.LinkDel(l); err != nil {
		return fmt.Errorf("delete veth %s in sandbox %q: %w", vethName, sandboxName, classify(err))
	}
	return nil
}
