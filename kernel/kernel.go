// Package kernel is the narrow interface between the driver and the Linux
// kernel: per-network sandboxes (a network namespace holding a bridge and a
// VXLAN device), veth pairs for containers, and the static neighbour and FDB
// entries that steer traffic to remote VTEPs. The driver never touches
// netlink directly; it programs through Kernel, so tests can substitute the
// in-memory fake in kernel/fakekernel.
//
// Every method is safe to call from several goroutines at once for
// different sandboxes. Calls for one sandbox are serialised by the caller
// (the driver holds the network's lock).
package kernel

import (
	"errors"
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// Errors the driver relies on. Implementations wrap them with detail.
var (
	// ErrNotFound: the named sandbox, link or entry does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: the object to create exists already.
	ErrExists = errors.New("already exists")
)

// Names of the devices inside every sandbox.
const (
	BridgeName = "br0"
	VXLANName  = "vxlan0"
)

// SandboxSpec describes one network's sandbox.
type SandboxSpec struct {
	// Name identifies the sandbox (derived from the network id); it names the
	// namespace mount in the implementation's sandbox directory.
	Name string
	// VNI is the VXLAN network identifier, 1..2^24-1.
	VNI uint32
	// Port is the UDP destination port of the VXLAN device.
	Port uint16
	// Local is this host's VTEP (underlay) address; its family decides the
	// underlay family of the VXLAN device.
	Local netip.Addr
	// MTU applies to the bridge and the VXLAN device.
	MTU int
}

// Veth describes a container interface: a veth pair whose sandbox end is
// enslaved to the bridge and whose host end is handed to Docker, which moves
// it into the container.
type Veth struct {
	// HostName is the end left in the host namespace (Docker's SrcName).
	HostName string
	// SandboxName is the end attached to the sandbox bridge.
	SandboxName string
	// MAC is set on the host (container) end.
	MAC hwaddr.MAC
	MTU int
}

// Neighbor is a static (permanent) neighbour entry on the sandbox VXLAN
// device: the VXLAN proxy answers ARP and NDP from these.
type Neighbor struct {
	IP  netip.Addr
	MAC hwaddr.MAC
}

// FDBEntry is a static forwarding entry on the sandbox VXLAN device: frames
// for MAC go to VTEP. An all-zero MAC is a flood (head-end replication)
// entry; several may exist for one MAC with different VTEPs.
type FDBEntry struct {
	MAC  hwaddr.MAC
	VTEP netip.Addr
}

// SandboxInfo is what a sandbox holds, read back from the kernel: enough
// to take over one whose network the plugin has no record of.
type SandboxInfo struct {
	// Spec is the sandbox as built: VNI, port and local address from its
	// VXLAN device, MTU from its bridge.
	Spec SandboxSpec
	// Veths are the sandbox ends of its veth pairs.
	Veths []SandboxVeth
}

// SandboxVeth is the sandbox end of a veth pair.
type SandboxVeth struct {
	Name string
	// Attached: the other end has left the host namespace, into a
	// container's. One still in the host namespace carries no container.
	Attached bool
}

// Attached counts the veths whose other end is in a container.
func (i SandboxInfo) Attached() int {
	n := 0
	for _, v := range i.Veths {
		if v.Attached {
			n++
		}
	}
	return n
}

// Kernel programs the data path.
type Kernel interface {
	// CreateSandbox builds a namespace with bridge BridgeName and VXLAN
	// device VXLANName (created in the host namespace, so its UDP socket
	// stays there, then moved in and enslaved), learning off, proxy on, all
	// links up. A failure leaves nothing behind.
	CreateSandbox(spec SandboxSpec) error
	// DeleteSandbox removes the sandbox and everything in it.
	DeleteSandbox(name string) error
	// Sandboxes lists the sandboxes that exist, including ones left by a
	// previous run.
	Sandboxes() ([]string, error)
	// Inspect reads back what the sandbox holds.
	Inspect(sandbox string) (SandboxInfo, error)
	// RemoveLeftovers deletes every sandbox for which keep (if not nil)
	// returns false, and every host-side VXLAN or veth device of ours that a
	// previous run left behind. Called once at start, before any sandbox is
	// created.
	RemoveLeftovers(keep func(sandbox string) bool) error

	// AddVeth creates the pair, enslaves the sandbox end to the bridge and
	// brings it up; the host end is left down for Docker to move.
	AddVeth(sandbox string, v Veth) error
	// DeleteVeth deletes the pair by its sandbox end.
	DeleteVeth(sandbox, sandboxName string) error

	// SetNeighbor adds or replaces the entry for n.IP.
	SetNeighbor(sandbox string, n Neighbor) error
	DeleteNeighbor(sandbox string, ip netip.Addr) error
	// AddFDB adds (appends, for the zero MAC) an entry; adding one that
	// exists is not an error.
	AddFDB(sandbox string, e FDBEntry) error
	DeleteFDB(sandbox string, e FDBEntry) error

	// Neighbors and FDB list the static entries on the sandbox VXLAN device,
	// for reconciliation and inspection.
	Neighbors(sandbox string) ([]Neighbor, error)
	FDB(sandbox string) ([]FDBEntry, error)
}
