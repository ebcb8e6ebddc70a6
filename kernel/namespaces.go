package kernel

// Sandbox namespaces: opening, caching and creating them.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

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
	pipe, err := newPipeline(netns.NsHandle(fd))
	if err != nil {
		h.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox %q: open netlink socket in namespace: %w", name, err)
	}
	return &sandbox{name: name, fd: fd, dev: st.Dev, ino: st.Ino, h: h, pipe: pipe}, nil
}

func (sb *sandbox) close() {
	sb.h.Close()
	sb.pipe.close()
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

// newNamespace creates a network namespace, tuned, and bind-mounts it on
// path (an existing empty file), which keeps it.
func newNamespace(path string) error {
	ns, err := nsthread.New()
	if err != nil {
		return err
	}
	defer ns.Close()
	if err := nsthread.Do(ns, tuneNamespace); err != nil {
		return err
	}
	return nsthread.Mount(ns, path)
}

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

// tuneNamespace sets the IPv6 defaults of the namespace the calling
// (locked) thread is in, before any device is created or moved in: IPv6
// enabled (the VXLAN proxy answers NDP only for a device with IPv6 state,
// and IPv6 neighbour entries need it), no DAD and no link-local addresses
// (the bridge and VXLAN device need none, and this keeps router
// solicitations and MLD reports from being flooded to every VTEP).
// A kernel without IPv6 is left alone.
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
