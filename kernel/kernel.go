// Package kernel is the narrow interface between the driver and the Linux
// kernel: per-network sandboxes (a network namespace holding a bridge and a
// VXLAN device), veth pairs for containers, and the static neighbour and FDB
// entries that steer traffic to remote VTEPs. The driver never touches
// netlink directly; it programs through Kernel, so tests can substitute the
// in-memory fake in kernel/fakekernel, which kernel/kerneltest holds to
// the netlink implementation's behaviour.
//
// Every method is safe to call from several goroutines at once for
// different sandboxes. Calls for one sandbox are serialised by the caller
// (the driver holds the network's lock).
package kernel

import (
	"context"
	"errors"
	"fmt"
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
	// NotPermanent marks an entry read back in another state than the
	// NUD_PERMANENT the plugin programs: NOARP (`ip neigh ... nud noarp`)
	// or one that may expire. Someone else made it. Ignored when
	// programming.
	NotPermanent bool `json:",omitempty"`
}

// FDBEntry is a static forwarding entry on the sandbox VXLAN device: frames
// for MAC go to VTEP. An all-zero MAC is a flood (head-end replication)
// entry; several may exist for one MAC with different VTEPs.
type FDBEntry struct {
	MAC  hwaddr.MAC
	VTEP netip.Addr
	// NotPermanent: as Neighbor's (`bridge fdb add ... static` makes one).
	NotPermanent bool `json:",omitempty"`
}

// Repair is one fix RepairSandbox made to a sandbox's devices.
type Repair struct {
	// Device is BridgeName, VXLANName or a veth's sandbox end.
	Device string
	// Problem says what was wrong: "missing", "down", "not on the bridge",
	// or the VXLAN settings that differed.
	Problem string
	// Rebuilt: the device was created anew (else only set up or enslaved).
	Rebuilt bool
}

// EventKind says what an Event is about.
type EventKind uint8

const (
	// EventNeighbor: a neighbour entry on VXLANName changed.
	EventNeighbor EventKind = iota + 1
	// EventFDB: an FDB entry of VXLANName changed.
	EventFDB
	// EventDevice: BridgeName or VXLANName changed.
	EventDevice
	// EventLost: events were lost (the socket overflowed, or the
	// subscription broke); only a full comparison finds what changed.
	EventLost
)

// Event is one change in a sandbox, as Watch reports it.
type Event struct {
	Kind EventKind
	// Deleted: the entry or device is gone; else it was added or changed.
	Deleted  bool
	Neighbor Neighbor // EventNeighbor
	FDB      FDBEntry // EventFDB
	// Device names the device of an EventDevice; Broken says it is now
	// deleted, down, or (VXLANName) off the bridge.
	Device string
	Broken bool
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
	// RepairSandbox rebuilds inside the existing sandbox spec.Name what of
	// CreateSandbox's work is missing or wrong: the bridge (and every veth
	// re-enslaved to it), the VXLAN device (made anew from spec), links
	// down or off the bridge. The namespace and the veths are kept. It
	// returns what it fixed, also when a later step fails; ErrNotFound
	// when the namespace itself is gone.
	RepairSandbox(spec SandboxSpec) ([]Repair, error)
	// Watch reports the changes of the sandbox's devices and of the
	// neighbour and FDB entries of its VXLAN device until ctx ends, when
	// the channel is closed; it is closed earlier (after an EventLost) if
	// the subscription breaks. The caller must keep receiving: a reader
	// that falls behind gets an EventLost instead of what it missed.
	Watch(ctx context.Context, sandbox string) (<-chan Event, error)
	// Inspect reads back what the sandbox holds: its devices' spec (zero
	// for a missing device) and its veths; ErrNotFound when the namespace
	// is gone.
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

	// Program applies ops, neighbour and FDB changes of the sandbox's
	// VXLAN device, in order and many at a time: the one way to write
	// entries. It returns nil when every op succeeded, else an error per
	// op (nil where it succeeded): each failure is reported, the others
	// are applied. Setting a neighbour replaces the entry of its IP;
	// adding a unicast FDB entry replaces its MAC's destination, adding a
	// flood (zero MAC) one appends a destination; adding what is there
	// already succeeds. Deleting an entry that is not there succeeds too,
	// as the kernel's own delete of a MAC's other destination does: the
	// end state is what was asked; an FDB delete removes exactly its
	// (MAC, VTEP). An op with an invalid IP or VTEP (or the unspecified
	// VTEP) fails alone. A missing sandbox or VXLAN device is ErrNotFound
	// for every op.
	Program(sandbox string, ops []EntryOp) []error

	// Neighbors and FDB list the entries on the sandbox VXLAN device that
	// someone made (permanent or NOARP; not the kernel's own), for
	// reconciliation and inspection.
	Neighbors(sandbox string) ([]Neighbor, error)
	FDB(sandbox string) ([]FDBEntry, error)
}

// EntryOpKind says what an EntryOp does.
type EntryOpKind uint8

const (
	OpSetNeighbor EntryOpKind = iota + 1
	OpDeleteNeighbor
	OpAddFDB
	OpDeleteFDB
)

func isFDBOp(k EntryOpKind) bool { return k == OpAddFDB || k == OpDeleteFDB }

func isDeleteOp(k EntryOpKind) bool { return k == OpDeleteNeighbor || k == OpDeleteFDB }

// EntryOp is one change for Program: Neighbor for the neighbour kinds (a
// delete uses only its IP), FDB for the FDB kinds.
type EntryOp struct {
	Kind     EntryOpKind
	Neighbor Neighbor
	FDB      FDBEntry
}

func (o *EntryOp) String() string {
	switch o.Kind {
	case OpSetNeighbor:
		return fmt.Sprintf("set neighbour %s lladdr %s", o.Neighbor.IP, o.Neighbor.MAC)
	case OpDeleteNeighbor:
		return fmt.Sprintf("delete neighbour %s", o.Neighbor.IP)
	case OpAddFDB:
		return fmt.Sprintf("add fdb %s dst %s", o.FDB.MAC, o.FDB.VTEP)
	case OpDeleteFDB:
		return fmt.Sprintf("delete fdb %s dst %s", o.FDB.MAC, o.FDB.VTEP)
	}
	return fmt.Sprintf("entry op %d", o.Kind)
}
