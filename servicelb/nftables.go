package servicelb

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// nftLB programs the kernel's nf_tables in each sandbox. It keeps no
// state: everything it needs is in the sandboxes' tables.
type nftLB struct{}

// NewNftables returns the real Programmer.
func NewNftables() Programmer { return nftLB{} }

// Apply reads the table first: to carry its counters over, and to skip
// the batch when the table already is what svcs give. A table it cannot
// read is replaced all the same (its counters start from zero).
func (nftLB) Apply(nsPath string, svcs []Service) error {
	norm, err := Normalize(svcs)
	if err != nil {
		return err
	}
	send, recv := socketBuffers(norm)
	return inNamespace(nsPath, send, recv, func(ns netns.NsHandle, c *nftables.Conn) error {
		have, rerr := readTable(c, true)
		if len(norm) == 0 {
			if rerr == nil && have == nil {
				return nil
			}
			nftutil.QueueRemoveTable(c, newTable())
			return flush(c, "delete table")
		}
		want := build(norm, have.counters())
		if rerr == nil && want.sameAs(have) {
			return nil
		}
		if err := want.queueReplace(c); err != nil {
			return err
		}
		err := flush(c, fmt.Sprintf("replace table with %d services", len(norm)))
		if err != nil && (!errors.Is(err, unix.ENOBUFS) || !isApplied(ns, want)) {
			return err
		}
		return forgetUDP(ns, removedBackends(have, want))
	})
}

// isApplied reports whether the table in ns is want. After ENOBUFS the
// batch may have been committed or not (the kernel dropped some of its
// acknowledgements); it asks through a fresh socket, since the old one may
// still hold acknowledgements.
func isApplied(ns netns.NsHandle, want *ruleset) bool {
	c, err := nftutil.Conn(ns, nftables.AsLasting())
	if err != nil {
		return false
	}
	defer c.CloseLasting()
	have, err := readTable(c, true)
	return err == nil && want.sameAs(have)
}

func (nftLB) Counters(nsPath string) (map[Backend]uint64, error) {
	var out map[Backend]uint64
	err := inNamespace(nsPath, bufferBase, bufferBase, func(_ netns.NsHandle, c *nftables.Conn) error {
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

func (nftLB) Remove(nsPath string) error {
	err := inNamespace(nsPath, bufferBase, bufferBase, func(_ netns.NsHandle, c *nftables.Conn) error {
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
