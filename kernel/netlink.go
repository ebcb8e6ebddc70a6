package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// Name prefixes of the devices this package creates in the host namespace.
// RemoveLeftovers deletes every host link whose name starts with one of them,
// so nothing else in the host namespace may use them.
const (
	// HostVXLANPrefix starts the temporary name a VXLAN device has while it
	// sits in the host namespace, between its creation and its move into the
	// sandbox (where it is renamed VXLANName).
	HostVXLANPrefix = "ovx"
	// HostVethPrefix should start Veth.HostName, the host end of every
	// container veth, so that a host end a crashed run created but Docker
	// never moved into a container is recognised as a leftover. AddVeth
	// accepts other names, but RemoveLeftovers only finds prefixed ones.
	HostVethPrefix = "ovh"
)

// netlinkTimeout bounds every netlink request, so a wedged kernel call fails
// instead of hanging the driver.
const netlinkTimeout = 30 * time.Second

// NetlinkConfig configures NewNetlink.
type NetlinkConfig struct {
	// HostNS is the namespace acting as the host: VXLAN devices are created
	// there (their UDP sockets stay there) and veth host ends live there.
	// The zero value (or netns.None()) means the namespace of the calling
	// thread when NewNetlink runs. The handle is only used during
	// NewNetlink; the caller keeps ownership of it.
	HostNS netns.NsHandle
	// SandboxDir is the directory where every sandbox namespace is
	// bind-mounted as a file named after the sandbox. It is created if
	// missing. It must belong to this instance alone: every file in it is
	// treated as one of our sandboxes. Never /run/netns.
	SandboxDir string
}

// Netlink is the Kernel implementation that programs the running kernel
// over rtnetlink. Build it with NewNetlink; release it with Close.
type Netlink struct {
	dir  string
	host *netlink.Handle // rtnetlink socket in the host namespace; safe for concurrent use
	// hostNS is the host namespace (a dup of its handle), for telling a
	// veth whose other end is there from one moved into a container.
	hostNS int

	// seq numbers temporary host-side VXLAN names, so concurrent
	// CreateSandbox calls never collide.
	seq atomic.Uint32

	// mu guards sandboxes, the cache of open sandbox namespaces (fd and
	// rtnetlink sockets) keyed by sandbox name, and the refs field of every
	// sandbox. It is a leaf lock: nothing else is locked and no netlink or
	// file system call is made while it is held.
	mu        lockrank.Mutex[lockrank.SandboxCache]
	sandboxes map[string]*sandbox
}

var _ Kernel = (*Netlink)(nil)

// sandbox is an open sandbox namespace. Its fields are immutable after
// openSandbox except vxlanIndex, which is atomic, and refs. A cached
// sandbox is closed only when its last reference goes, so a call in flight
// never uses a closed (and possibly reused) file descriptor.
type sandbox struct {
	// refs counts the cache's reference (while cached) and every call using
	// the sandbox. Guarded by Netlink.mu.
	refs int

	name     string
	fd       int    // the namespace (nsfs) file, O_RDONLY
	dev, ino uint64 // identity of the namespace, to detect a replaced mount
	h        *netlink.Handle
	// pipe is a second rtnetlink socket in the namespace, for Program.
	pipe *pipeline
	// vxlanIndex caches the ifindex of VXLANName inside the sandbox; 0 means
	// not looked up yet.
	vxlanIndex atomic.Int32
}

// NewNetlink opens a host-namespace rtnetlink handle and prepares the
// sandbox directory.
func NewNetlink(cfg NetlinkConfig) (*Netlink, error) {
	if cfg.SandboxDir == "" {
		return nil, errors.New("netlink kernel: SandboxDir must be set")
	}
	dir, err := filepath.Abs(cfg.SandboxDir)
	if err != nil {
		return nil, fmt.Errorf("netlink kernel: sandbox dir %q: %w", cfg.SandboxDir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("netlink kernel: create sandbox dir: %w", err)
	}

	hostNS := cfg.HostNS
	if hostNS == 0 || hostNS == netns.None() {
		hostNS, err = nsthread.Current()
		if err != nil {
			return nil, fmt.Errorf("netlink kernel: open current network namespace: %w", err)
		}
		defer hostNS.Close()
	}
	if err := writableProcSys(); err != nil {
		return nil, fmt.Errorf("netlink kernel: %w", err)
	}
	h, err := newHandle(hostNS)
	if err != nil {
		return nil, fmt.Errorf("netlink kernel: open netlink socket in host namespace: %w", err)
	}
	hostFD, err := unix.FcntlInt(uintptr(hostNS), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink kernel: keep the host namespace: %w", err)
	}
	return &Netlink{dir: dir, host: h, hostNS: hostFD, sandboxes: map[string]*sandbox{}}, nil
}

// Close releases the host handle and every cached sandbox handle. It does
// not delete anything. The Netlink must not be used afterwards.
func (n *Netlink) Close() error {
	n.mu.Lock()
	cached := n.sandboxes
	n.sandboxes = map[string]*sandbox{}
	n.mu.Unlock()
	for _, sb := range cached {
		n.release(sb)
	}
	n.host.Close()
	unix.Close(n.hostNS)
	return nil
}

func newHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	h, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_ROUTE) })
	if err != nil {
		return nil, err
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// kernelError keeps the kernel's error text and errno while also matching
// one of the package sentinels with errors.Is.
type kernelError struct {
	err      error
	sentinel error
}

func (e *kernelError) Error() string   { return e.err.Error() }
func (e *kernelError) Unwrap() []error { return []error{e.err, e.sentinel} }

// classify adds ErrExists to EEXIST and ErrNotFound to ENOENT/ENODEV and
// "link not found", leaving other errors as they are.
func classify(err error) error {
	var lnf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return &kernelError{err, ErrExists}
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.As(err, &lnf):
		return &kernelError{err, ErrNotFound}
	}
	return err
}

// classifyExists adds ErrExists to EEXIST only: for creations, where a
// missing object is not the caller's "not found".
func classifyExists(err error) error {
	if errors.Is(err, unix.EEXIST) {
		return &kernelError{err, ErrExists}
	}
	return err
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.As(err, &lnf)
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 ||
		strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid sandbox name %q", name)
	}
	return nil
}

func (n *Netlink) path(name string) string { return filepath.Join(n.dir, name) }
