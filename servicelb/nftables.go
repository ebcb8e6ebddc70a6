package servicelb

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
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

func (nftLB) Counters(nsPath string) (map[Backend]uint64, error) {
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

func (nftLB) Remove(nsPath string) error {
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
