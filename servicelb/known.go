package servicelb

import (
	"sync/atomic"

	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// known remembers, per namespace path, the services whose table this
// process last left in the namespace and the namespace's nf_tables
// generation just after: while the generation is the same, nothing has
// committed anything there since (not another process, not a hand with
// nft), so the table is exactly those services and the next Apply can
// send just the difference. Anything else (no entry, another generation,
// another namespace at the path, an error) sends Apply back to reading
// the kernel's table and replacing it, which is always right.
type known struct {
	// mu guards tables. A leaf, rank LBTables: taken under the driver's
	// LBSandboxes, never held across a kernel call.
	mu     lockrank.Mutex[lockrank.LBTables]
	tables map[string]knownTable
}

type knownTable struct {
	gen  generation
	svcs []Service // normalized; never modified once stored
}

// get returns the services the table at path holds if gen says it is
// still the one this process left there.
func (k *known) get(path string, gen generation) ([]Service, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	t, ok := k.tables[path]
	return t.svcs, ok && t.gen == gen
}

// forget drops what is known of path.
func (k *known) forget(path string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.tables, path)
}

// committed records that the table at path holds svcs after this
// process's one batch, sent at generation before: if ns's generation is
// now the next one, no other commit came in between.
func (k *known) committed(ns netns.NsHandle, path string, before generation, svcs []Service) {
	after, err := readGeneration(ns)
	next := before
	if next.id++; next.id == 0 {
		next.id = 1 // the kernel skips 0 when the counter wraps
	}
	if err != nil || after != next {
		k.forget(path)
		return
	}
	k.unchanged(path, after, svcs)
}

// unchanged records that the table at path holds svcs at generation gen.
func (k *known) unchanged(path string, gen generation, svcs []Service) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.tables == nil {
		k.tables = map[string]knownTable{}
	}
	k.tables[path] = knownTable{gen: gen, svcs: svcs}
}

// counts is Stats kept with atomics.
type counts struct {
	replaces, increments, fallbacks, objects atomic.Uint64
}

func (c *counts) stats() Stats {
	return Stats{Replaces: c.replaces.Load(), Increments: c.increments.Load(),
		Fallbacks: c.fallbacks.Load(), Objects: c.objects.Load()}
}
