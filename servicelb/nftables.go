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
	a := apply{lb: lb, path: nsPath, norm: norm}
	a.send, a.recv = socketBuffers(norm)
	err = inNamespace(nsPath, a.send, a.recv, func(ns netns.NsHandle, c *nftables.Conn) error {
		a.ns, a.c = ns, c
		var gerr error
		a.gen, gerr = readGeneration(ns)
		a.genOK = gerr == nil
		var pending []Backend
		if old, ok := lb.known.get(nsPath, a.gen); ok && a.genOK && len(norm) > 0 {
			done, removed, err := a.increment(old)
			if done {
				return err
			}
			pending = removed
		}
		lb.known.forget(nsPath)
		return a.replace(pending)
	})
	if errors.Is(err, ErrNoSandbox) {
		lb.known.forget(nsPath)
	}
	return err
}

// apply is one Apply's work in one namespace.
type apply struct {
	lb         *nftLB
	ns         netns.NsHandle
	c          *nftables.Conn // reads the table
	path       string
	send, recv int // batch socket's buffers
	gen        generation
	genOK      bool // gen was read, before the table
	norm       []Service
}

// increment sends the difference from old, which the table holds, to
// a.norm. done false means that the table is to be replaced instead: the
// change is not a delta's, or the kernel refused it (then removed are the
// backends whose UDP flows the replace must forget).
func (a *apply) increment(old []Service) (done bool, removed []Backend, err error) {
	d, ok := diff(old, a.norm)
	if !ok {
		return false, nil, nil
	}
	if len(d.pairs) == 0 {
		return true, nil, nil
	}
	b, err := newBatch()
	if err != nil {
		return true, nil, err
	}
	objects, removed, err := d.queue(b.c)
	if err != nil {
		return true, nil, err
	}
	if err := b.send(a.ns, a.send, a.recv); err != nil {
		a.lb.counts.fallbacks.Add(1)
		return false, removed, nil
	}
	a.lb.counts.increments.Add(1)
	a.lb.counts.objects.Add(uint64(objects))
	a.lb.known.committed(a.ns, a.path, a.gen, a.norm)
	return true, removed, forgetUDP(a.ns, removed)
}

// replace makes the table a.norm by replacing it whole, unless it is
// a.norm already; pending are removed backends whose UDP flows are still
// to be forgotten.
func (a *apply) replace(pending []Backend) error {
	have, rerr := readTable(a.c, true)
	if len(a.norm) == 0 {
		if rerr == nil && have == nil {
			return nil
		}
		nftutil.QueueRemoveTable(a.c, newTable())
		return flush(a.c, "delete table")
	}
	want := build(a.norm, have.counters())
	if rerr == nil && want.sameAs(have) {
		if a.genOK {
			a.lb.known.unchanged(a.path, a.gen, a.norm)
		}
		return forgetUDP(a.ns, pending)
	}
	b, err := newBatch()
	if err != nil {
		return err
	}
	objects, err := want.queueReplace(b.c)
	if err != nil {
		return err
	}
	if err := b.send(a.ns, a.send, a.recv); err != nil && (!errors.Is(err, unix.ENOBUFS) || !isApplied(a.ns, want)) {
		return fmt.Errorf("replace table inet %s with %d services: %w", TableName, len(a.norm), err)
	}
	a.lb.counts.replaces.Add(1)
	a.lb.counts.objects.Add(uint64(objects))
	if a.genOK {
		a.lb.known.committed(a.ns, a.path, a.gen, a.norm)
	}
	return forgetUDP(a.ns, append(removedBackends(have, want), pending...))
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
