package servicelb

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// nftLB programs the kernel's nf_tables in each sandbox. What it keeps is
// a cache: which tables it wrote and are unchanged since (known), so that
// a change sends only its difference; everything else it reads from the
// sandboxes' tables.
type nftLB struct {
	known  known
	counts counts
}

// NewNftables returns the real Programmer.
func NewNftables() Programmer { return &nftLB{} }

// Apply sends, when the table is the one it last wrote (same generation),
// just the difference; else, or when the kernel refuses the difference,
// it reads the table, to carry its counters over and to skip the batch
// when the table already is what svcs give, and replaces it. A table it
// cannot read is replaced all the same (its counters start from zero).
func (lb *nftLB) Apply(nsPath string, svcs []Service) error {
	norm, err := Normalize(svcs)
	if err != nil {
		return err
	}
	send, recv := socketBuffers(norm)
	err = inNamespace(nsPath, send, recv, func(ns netns.NsHandle, c *nftables.Conn) error {
		gen, gerr := readGeneration(ns)
		var pending []Backend
		if old, ok := lb.known.get(nsPath, gen); ok && gerr == nil && len(norm) > 0 {
			done, removed, err := lb.increment(ns, c, nsPath, gen, old, norm)
			if done {
				return err
			}
			// Refused: the socket may still hold acknowledgements.
			pending = removed
			if c, err = nftutil.Conn(ns, nftables.AsLasting(), withBuffers(send, recv)); err != nil {
				return err
			}
			defer c.CloseLasting()
		}
		lb.known.forget(nsPath)
		return lb.replace(ns, c, nsPath, gen, gerr == nil, norm, pending)
	})
	if errors.Is(err, ErrNoSandbox) {
		lb.known.forget(nsPath)
	}
	return err
}

// increment sends the difference from old, which the table holds, to
// norm. done false means that the table is to be replaced instead: the
// change is not a delta's, or the kernel refused it (then removed are the
// backends whose UDP flows the replace must forget).
func (lb *nftLB) increment(ns netns.NsHandle, c *nftables.Conn, nsPath string, gen generation, old, norm []Service) (done bool, removed []Backend, err error) {
	d, ok := diff(old, norm)
	if !ok {
		return false, nil, nil
	}
	if len(d.pairs) == 0 {
		return true, nil, nil
	}
	objects, removed, err := d.queue(c)
	if err != nil {
		return true, nil, err // queued, not sent: c cannot be emptied
	}
	if err := flush(c, fmt.Sprintf("change %d of %d services", len(d.pairs), len(norm))); err != nil {
		lb.counts.fallbacks.Add(1)
		return false, removed, nil
	}
	lb.counts.increments.Add(1)
	lb.counts.objects.Add(uint64(objects))
	lb.known.committed(ns, nsPath, gen, norm)
	return true, removed, forgetUDP(ns, removed)
}

// replace makes the table norm by replacing it whole, unless it is norm
// already; pending are removed backends whose UDP flows are still to be
// forgotten. genOK says gen was read before the table.
func (lb *nftLB) replace(ns netns.NsHandle, c *nftables.Conn, nsPath string, gen generation, genOK bool, norm []Service, pending []Backend) error {
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
		if genOK {
			lb.known.unchanged(nsPath, gen, norm)
		}
		return forgetUDP(ns, pending)
	}
	objects, err := want.queueReplace(c)
	if err != nil {
		return err
	}
	err = flush(c, fmt.Sprintf("replace table with %d services", len(norm)))
	if err != nil && (!errors.Is(err, unix.ENOBUFS) || !isApplied(ns, want)) {
		return err
	}
	lb.counts.replaces.Add(1)
	lb.counts.objects.Add(uint64(objects))
	if genOK {
		lb.known.committed(ns, nsPath, gen, norm)
	}
	return forgetUDP(ns, append(removedBackends(have, want), pending...))
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

func (lb *nftLB) Counters(nsPath string) (map[Backend]uint64, error) {
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

func (lb *nftLB) Remove(nsPath string) error {
	lb.known.forget(nsPath)
	err := inNamespace(nsPath, bufferBase, bufferBase, func(_ netns.NsHandle, c *nftables.Conn) error {
		nftutil.QueueRemoveTable(c, newTable())
		return flush(c, "delete table")
	})
	if errors.Is(err, ErrNoSandbox) {
		return nil
	}
	return err
}

func (lb *nftLB) Stats() Stats { return lb.counts.stats() }

// flush sends the queued batch; on failure the kernel applied none of it.
func flush(c *nftables.Conn, what string) error {
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%s in table inet %s: %w", what, TableName, err)
	}
	return nil
}
