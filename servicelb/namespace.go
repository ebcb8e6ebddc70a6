package servicelb

import (
	"errors"
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// nsGetNSType is NS_GET_NSTYPE (linux/nsfs.h), which x/sys lacks: the
// type (CLONE_NEW*) of the namespace an nsfs file descriptor refers to.
const nsGetNSType = 0xb703

// inNamespace runs f with the network namespace at nsPath (open until f
// returns) and a lasting nftables connection to it, whose socket buffers hold send and recv bytes. A
// path with no namespace behind it (no file, or a plain file: Docker
// unmounts a SandboxKey before it deletes it) gives an error wrapping
// ErrNoSandbox.
func inNamespace(nsPath string, send, recv int, f func(ns netns.NsHandle, c *nftables.Conn) error) error {
	ns, err := netns.GetFromPath(nsPath)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("servicelb: %s: %w", nsPath, ErrNoSandbox)
	}
	if err != nil {
		return fmt.Errorf("servicelb: open network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	typ, err := unix.IoctlRetInt(int(ns), nsGetNSType)
	if errors.Is(err, unix.ENOTTY) {
		return fmt.Errorf("servicelb: %s is not a namespace file: %w", nsPath, ErrNoSandbox)
	}
	if err != nil || typ != unix.CLONE_NEWNET {
		return fmt.Errorf("servicelb: %s is not a network namespace (type %#x, %v)", nsPath, typ, err)
	}
	c, err := nftutil.Conn(ns, nftables.AsLasting(), withBuffers(send, recv))
	if err != nil {
		return fmt.Errorf("servicelb: %s: %w", nsPath, err)
	}
	defer c.CloseLasting()
	if err := f(ns, c); err != nil {
		return fmt.Errorf("servicelb: %s: %w", nsPath, err)
	}
	return nil
}
