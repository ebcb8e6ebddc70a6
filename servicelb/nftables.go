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

// Nftables programs the kernel's nf_tables in each sandbox. It keeps no
// state: everything it needs is in the sandboxes' tables.
type Nftables struct{}

// NewNftables returns the real Programmer.
func NewNftables() Programmer { return Nftables{} }

// ErrNoSandbox means there is no network namespace at the path given: the
// sandbox is gone. It wraps os.ErrNotExist.
var ErrNoSandbox = fmt.Errorf("no network namespace there (sandbox gone?): %w", os.ErrNotExist)

// inNamespace runs f with a lasting nftables connection to the network
// namespace at nsPath, whose socket buffers hold send and recv bytes. A path with no namespace behind it (no file, or a
// plain file: Docker unmounts a SandboxKey before it deletes it) gives an
// error wrapping ErrNoSandbox.
func inNamespace(nsPath string, send, recv int, f func(c *nftables.Conn) error) error {
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
	if err := f(c); err != nil {
		return fmt.Errorf("servicelb: %s: %w", nsPath, err)
	}
	return nil
}

// Apply reads the table first: to carry its counters over, and to skip
// the batch when the table already is what svcs give. A table it cannot
// read is replaced all the same (its counters start from zero).
func (Nftables) Apply(nsPath string, svcs []Service) error {
	norm, err := Normalize(svcs)
	if err != nil {
		return err
	}
	send, recv := socketBuffers(norm)
	var want *ruleset
	err = inNamespace(nsPath, send, recv, func(c *nftables.Conn) error {
		have, rerr := readTable(c, true)
		if len(norm) == 0 {
			if rerr == nil && have == nil {
				return nil
			}
			nftutil.QueueRemoveTable(c, newTable())
			return flush(c, "delete table")
		}
		want = build(norm, have.counters())
		if rerr == nil && want.sameAs(have) {
			return nil
		}
		if err := want.queueReplace(c); err != nil {
			return err
		}
		return flush(c, fmt.Sprintf("replace table with %d services", len(norm)))
	})
	if errors.Is(err, unix.ENOBUFS) && want != nil && isApplied(nsPath, want) {
		return nil // only acknowledgements were lost
	}
	return err
}

// isApplied reports whether the sandbox's table is want, through a fresh
// socket: after ENOBUFS the batch may have been committed or not.
func isApplied(nsPath string, want *ruleset) bool {
	return inNamespace(nsPath, bufferBase, bufferBase, func(c *nftables.Conn) error {
		have, err := readTable(c, true)
		if err == nil && !want.sameAs(have) {
			err = errors.New("not applied")
		}
		return err
	}) == nil
}

func (Nftables) Counters(nsPath string) (map[Backend]uint64, error) {
	var out map[Backend]uint64
	err := inNamespace(nsPath, bufferBase, bufferBase, func(c *nftables.Conn) error {
		rs, err := readTable(c, false)
		if err != nil {
			return err
		}
		ctrs := rs.counters()
		out = make(map[Backend]uint64, len(ctrs))
		for b, ctr := range ctrs {
			out[b] = ctr.Packets
		}
		return nil
	})
	return out, err
}

func (Nftables) Remove(nsPath string) error {
	err := inNamespace(nsPath, bufferBase, bufferBase, func(c *nftables.Conn) error {
		nftutil.QueueRemoveTable(c, newTable())
		return flush(c, "delete table")
	})
	if errors.Is(err, ErrNoSandbox) {
		return nil
	}
	return err
}

// flush sends the queued batch; on failure the kernel applied none of it.
func flush(c *nftables.Conn, what string) error {
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%s in table inet %s: %w", what, TableName, err)
	}
	return nil
}
