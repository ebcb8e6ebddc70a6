package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
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
	mu        sync.Mutex
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
	// raw is a second rtnetlink socket in the namespace for requests the
	// netlink package has no call for (FDB get).
	raw *nl.SocketHandle
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
		runtime.LockOSThread()
		hostNS, err = netns.Get()
		runtime.UnlockOSThread()
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
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
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

// ---- sandbox namespaces ----

var errNotNetns = errors.New("not a network namespace mount")

// openSandbox opens the namespace mounted at path and a netlink handle in it.
func openSandbox(name, path string) (*sandbox, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %q: open %s: %w", name, path, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: statfs %s: %w", name, path, err)
	}
	if sfs.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: %s: %w", name, path, errNotNetns)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: stat %s: %w", name, path, err)
	}
	h, err := newHandle(netns.NsHandle(fd))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: open netlink socket in namespace: %w", name, err)
	}
	raw, err := newRawSocket(netns.NsHandle(fd))
	if err != nil {
		h.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: open netlink socket in namespace: %w", name, err)
	}
	return &sandbox{name: name, fd: fd, dev: st.Dev, ino: st.Ino, h: h, raw: raw}, nil
}

func newRawSocket(ns netns.NsHandle) (*nl.SocketHandle, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	if err := errors.Join(s.SetSendTimeout(&tv), s.SetReceiveTimeout(&tv)); err != nil {
		s.Close()
		return nil, err
	}
	return &nl.SocketHandle{Socket: s}, nil
}

func (sb *sandbox) close() {
	sb.h.Close()
	sb.raw.Close()
	unix.Close(sb.fd)
}

// sandbox returns the open sandbox called name, from the cache when the
// mount still holds the same namespace, else freshly opened (and cached).
// The caller must release it.
func (n *Netlink) sandbox(name string) (*sandbox, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	path := n.path(name)
	var st unix.Stat_t
	statErr := unix.Stat(path, &st)

	n.mu.Lock()
	cur := n.sandboxes[name]
	if cur != nil && statErr == nil && st.Dev == cur.dev && st.Ino == cur.ino {
		cur.refs++
		n.mu.Unlock()
		return cur, nil
	}
	n.mu.Unlock()
	if cur != nil {
		n.evict(name, cur) // mount gone or replaced behind our back
	}
	if statErr != nil {
		if errors.Is(statErr, unix.ENOENT) {
			return nil, fmt.Errorf("sandbox %q: %w", name, ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %q: stat %s: %w", name, path, statErr)
	}

	sb, err := openSandbox(name, path)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	cur = n.sandboxes[name]
	if cur != nil && cur.dev == sb.dev && cur.ino == sb.ino {
		cur.refs++ // lost a race with another opener
		n.mu.Unlock()
		sb.close()
		return cur, nil
	}
	n.mu.Unlock()
	if cur != nil {
		n.evict(name, cur)
	}
	n.insert(name, sb, 2) // the cache's reference and the caller's
	return sb, nil
}

// insert caches sb (a private sandbox) under name with refs references,
// the cache's included, evicting whatever was cached there.
func (n *Netlink) insert(name string, sb *sandbox, refs int) {
	n.mu.Lock()
	old := n.sandboxes[name]
	sb.refs = refs
	n.sandboxes[name] = sb
	n.mu.Unlock()
	if old != nil {
		n.release(old)
	}
}

// evict drops the cache's reference to sb if it is still cached as name.
func (n *Netlink) evict(name string, sb *sandbox) {
	n.mu.Lock()
	if n.sandboxes[name] != sb {
		n.mu.Unlock()
		return
	}
	delete(n.sandboxes, name)
	n.mu.Unlock()
	n.release(sb)
}

// uncache drops the cached handle of name, if any.
func (n *Netlink) uncache(name string) {
	n.mu.Lock()
	sb := n.sandboxes[name]
	n.mu.Unlock()
	if sb != nil {
		n.evict(name, sb)
	}
}

// release drops one reference and closes sb when it was the last.
func (n *Netlink) release(sb *sandbox) {
	n.mu.Lock()
	sb.refs--
	last := sb.refs == 0
	n.mu.Unlock()
	if last {
		sb.close()
	}
}

// newNamespace creates a network namespace and bind-mounts it on path (an
// existing empty file). It runs on a dedicated, locked OS thread that is
// never unlocked, so Go destroys the thread, and its namespace membership
// with it, when the goroutine returns.
func newNamespace(path string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread, on purpose: see above.
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare network namespace: %w", err)
			}
			if err := tuneNamespace(); err != nil {
				return err
			}
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind-mount namespace on %s: %w", path, err)
			}
			return nil
		}()
	}()
	return <-errc
}

// tuneNamespace sets the IPv6 defaults of the namespace the calling
// (locked) thread is in, before any device is created or moved in: IPv6
// enabled (the VXLAN proxy answers NDP only for a device with IPv6 state,
// and IPv6 neighbour entries need it), no DAD and no link-local addresses
// (the bridge and VXLAN device need none, and this keeps router
// solicitations and MLD reports from being flooded to every VTEP).
// A kernel without IPv6 is left alone.
// writableProcSys makes /proc/sys writable for the sandboxes' sysctls.
// Docker mounts it read-only in a managed plugin's container; the plugin
// has its own mount namespace and CAP_SYS_ADMIN, so remounting it there
// changes nothing for the host.
func writableProcSys() error {
	const path = "/proc/sys"
	err := unix.Access(path+"/net/ipv6/conf/default/disable_ipv6", unix.W_OK)
	if !errors.Is(err, unix.EROFS) {
		return nil
	}
	if err := unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("%s is read-only and cannot be remounted writable (the sandboxes need their sysctls): %w", path, err)
	}
	return nil
}

func tuneNamespace() error {
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/default"); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	for _, s := range []struct{ key, val string }{
		{"all/disable_ipv6", "0"},
		{"default/disable_ipv6", "0"},
		{"default/accept_dad", "0"},
		{"default/addr_gen_mode", "1"}, // IN6_ADDR_GEN_MODE_NONE
	} {
		p := "/proc/sys/net/ipv6/conf/" + s.key
		if err := os.WriteFile(p, []byte(s.val), 0); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // older kernel without this knob
			}
			return fmt.Errorf("set %s=%s in sandbox namespace: %w", p, s.val, err)
		}
	}
	return nil
}

// unmountAll detaches every mount stacked on path.
func unmountAll(path string) error {
	for i := 0; i < 64; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted after 64 unmounts", path)
}

// deleteLinks deletes every device in the sandbox except lo: VXLANName
// first, so its VNI and UDP port are released at once (namespace teardown
// is asynchronous), then the bridge and the veths (which takes their host
// or container ends with them).
func (sb *sandbox) deleteLinks() error {
	links, err := sb.h.LinkList()
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

// Inspect implements Kernel. A veth's other end is in the host namespace
// when the link's peer namespace id is the host's as the sandbox numbers
// it (ids are per namespace); any other id is a container's.
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
	if info.Spec.VNI == 0 || info.Spec.MTU == 0 {
		return SandboxInfo{}, fmt.Errorf("inspect sandbox %q: no %s with a VNI or no %s: %w", name, VXLANName, BridgeName, ErrNotFound)
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
	links, err := n.host.LinkList()
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

// ---- veths ----

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

// ---- neighbour and FDB entries ----

// vxlan returns the sandbox (which the caller must release) and the
// ifindex of its VXLAN device.
func (n *Netlink) vxlan(sandboxName string) (*sandbox, int, error) {
	sb, err := n.sandbox(sandboxName)
	if err != nil {
		return nil, 0, err
	}
	if idx := sb.vxlanIndex.Load(); idx != 0 {
		return sb, int(idx), nil
	}
	l, err := sb.h.LinkByName(VXLANName)
	if err != nil {
		n.release(sb)
		return nil, 0, fmt.Errorf("sandbox %q: find %s: %w", sandboxName, VXLANName, err)
	}
	sb.vxlanIndex.Store(int32(l.Attrs().Index))
	return sb, l.Attrs().Index, nil
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func ipOf(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

// SetNeighbor implements Kernel:
// ip neigh replace IP lladdr MAC dev vxlan0 nud permanent.
func (n *Netlink) SetNeighbor(sandboxName string, nb Neighbor) error {
	ip := nb.IP.Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("set neighbour in sandbox %q: invalid IP", sandboxName)
	}
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return fmt.Errorf("set neighbour %s: %w", ip, err)
	}
	defer n.release(sb)
	err = sb.h.NeighSet(&netlink.Neigh{
		LinkIndex:    idx,
		Family:       family(ip),
		State:        netlink.NUD_PERMANENT,
		IP:           ipOf(ip),
		HardwareAddr: nb.MAC.HardwareAddr(),
	})
	if err != nil {
		return fmt.Errorf("set neighbour %s lladdr %s in sandbox %q: %w", ip, nb.MAC, sandboxName, err)
	}
	return nil
}

// DeleteNeighbor implements Kernel.
func (n *Netlink) DeleteNeighbor(sandboxName string, ip netip.Addr) error {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return fmt.Errorf("delete neighbour in sandbox %q: invalid IP", sandboxName)
	}
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return fmt.Errorf("delete neighbour %s: %w", ip, err)
	}
	defer n.release(sb)
	err = sb.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: family(ip), IP: ipOf(ip)})
	if err != nil {
		return fmt.Errorf("delete neighbour %s in sandbox %q: %w", ip, sandboxName, classify(err))
	}
	return nil
}

func fdbNeigh(idx int, e FDBEntry, vtep netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    idx,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        netlink.NUD_PERMANENT,
		IP:           ipOf(vtep),
		HardwareAddr: e.MAC.HardwareAddr(),
	}
}

// AddFDB implements Kernel:
// bridge fdb replace MAC dev vxlan0 dst VTEP self permanent, or
// bridge fdb append ... for the all-zero (flood) MAC.
func (n *Netlink) AddFDB(sandboxName string, e FDBEntry) error {
	vtep := e.VTEP.Unmap()
	if !vtep.IsValid() || vtep.IsUnspecified() {
		return fmt.Errorf("add fdb %s in sandbox %q: invalid VTEP %v", e.MAC, sandboxName, e.VTEP)
	}
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return fmt.Errorf("add fdb %s dst %s: %w", e.MAC, vtep, err)
	}
	defer n.release(sb)
	nb := fdbNeigh(idx, e, vtep)
	if e.MAC.IsZero() {
		// Appending a destination that is there already is a no-op.
		err = sb.h.NeighAppend(nb)
	} else {
		err = sb.h.NeighSet(nb)
	}
	if err != nil {
		return fmt.Errorf("add fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, err)
	}
	return nil
}

// DeleteFDB implements Kernel: deletes exactly the (MAC, VTEP) entry.
func (n *Netlink) DeleteFDB(sandboxName string, e FDBEntry) error {
	vtep := e.VTEP.Unmap()
	if !vtep.IsValid() || vtep.IsUnspecified() {
		return fmt.Errorf("delete fdb %s in sandbox %q: invalid VTEP %v", e.MAC, sandboxName, e.VTEP)
	}
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return fmt.Errorf("delete fdb %s dst %s: %w", e.MAC, vtep, err)
	}
	defer n.release(sb)
	// The kernel answers a delete of (MAC, dst) with success, deleting
	// nothing, when MAC exists with other destinations only; look first.
	found, err := sb.hasFDB(idx, e.MAC, vtep)
	if err != nil {
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, err)
	}
	if !found {
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, ErrNotFound)
	}
	if err := sb.h.NeighDel(fdbNeigh(idx, e, vtep)); err != nil {
		return fmt.Errorf("delete fdb %s dst %s in sandbox %q: %w", e.MAC, vtep, sandboxName, classify(err))
	}
	return nil
}

// fdbFirst fetches the VXLAN FDB entry of mac (RTM_GETNEIGH on the device,
// Linux 5.0+) and returns its first destination; ok is false if there is no
// entry for mac.
func (sb *sandbox) fdbFirst(idx int, mac hwaddr.MAC) (dst netip.Addr, ok bool, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sb.raw}
	req.AddData(&netlink.Ndmsg{Family: unix.AF_BRIDGE, Index: uint32(idx), Flags: netlink.NTF_SELF})
	req.AddData(nl.NewRtAttr(netlink.NDA_LLADDR, mac[:]))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if errors.Is(err, unix.ENOENT) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("get fdb entry: %w", err)
	}
	for _, m := range msgs {
		nb, err := netlink.NeighDeserialize(m)
		if err != nil {
			return netip.Addr{}, false, fmt.Errorf("get fdb entry: %w", err)
		}
		if a, ok := netip.AddrFromSlice(nb.IP); ok {
			return a.Unmap(), true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// hasFDB reports whether the entry (mac, vtep) exists. A single-entry get
// answers for unicast MACs, which have one destination; a flood MAC with
// several destinations needs a dump when the first one is not vtep.
func (sb *sandbox) hasFDB(idx int, mac hwaddr.MAC, vtep netip.Addr) (bool, error) {
	first, ok, err := sb.fdbFirst(idx, mac)
	if err != nil || !ok {
		return false, err
	}
	if first == vtep {
		return true, nil
	}
	if !mac.IsZero() && mac[0]&1 == 0 {
		return false, nil
	}
	entries, err := sb.listFDB(idx)
	if err != nil {
		return false, err
	}
	return slices.Contains(entries, FDBEntry{MAC: mac, VTEP: vtep}), nil
}

// permanent reports a static entry we could have made: permanent and not
// a NOARP (kernel-made, e.g. multicast) or proxy entry.
func permanent(nb *netlink.Neigh) bool {
	return nb.State&netlink.NUD_PERMANENT != 0 && nb.State&netlink.NUD_NOARP == 0 &&
		nb.Flags&netlink.NTF_PROXY == 0
}

// Neighbors implements Kernel.
func (n *Netlink) Neighbors(sandboxName string) ([]Neighbor, error) {
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return nil, fmt.Errorf("list neighbours: %w", err)
	}
	defer n.release(sb)
	var out []Neighbor
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		list, err := sb.h.NeighList(idx, fam)
		if err != nil {
			return nil, fmt.Errorf("list neighbours in sandbox %q: %w", sandboxName, err)
		}
		for i := range list {
			nb := &list[i]
			if nb.LinkIndex != idx || !permanent(nb) {
				continue
			}
			ip, ok := netip.AddrFromSlice(nb.IP)
			mac, okMAC := hwaddr.FromHardwareAddr(nb.HardwareAddr)
			if !ok || !okMAC {
				continue
			}
			out = append(out, Neighbor{IP: ip.Unmap(), MAC: mac})
		}
	}
	return out, nil
}

// FDB implements Kernel.
func (n *Netlink) FDB(sandboxName string) ([]FDBEntry, error) {
	sb, idx, err := n.vxlan(sandboxName)
	if err != nil {
		return nil, fmt.Errorf("list fdb: %w", err)
	}
	defer n.release(sb)
	out, err := sb.listFDB(idx)
	if err != nil {
		return nil, fmt.Errorf("list fdb in sandbox %q: %w", sandboxName, err)
	}
	return out, nil
}

// listFDB dumps the static entries of the VXLAN device with ifindex idx.
func (sb *sandbox) listFDB(idx int) ([]FDBEntry, error) {
	list, err := sb.h.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return nil, err
	}
	var out []FDBEntry
	for i := range list {
		nb := &list[i]
		// The VXLAN driver's own entries carry NTF_SELF; the bridge's view of
		// the port (NTF_MASTER) and entries without a remote are not ours.
		if nb.LinkIndex != idx || nb.Flags&netlink.NTF_SELF == 0 || nb.Flags&netlink.NTF_MASTER != 0 ||
			!permanent(nb) || nb.IP == nil {
			continue
		}
		vtep, ok := netip.AddrFromSlice(nb.IP)
		mac, okMAC := hwaddr.FromHardwareAddr(nb.HardwareAddr)
		if !ok || !okMAC {
			continue
		}
		out = append(out, FDBEntry{MAC: mac, VTEP: vtep.Unmap()})
	}
	return out, nil
}
