package lockrank

import (
	"fmt"
	"slices"
	"sync"
)

// held is what each goroutine holds, by goroutine id, for the checking
// build. Its own mutex is outside the order: nothing is taken under it.
type held struct {
	mu sync.Mutex
	by map[int64][]Rank
}

// acquire records that goroutine g takes a lock of rank r, or returns the
// violation: a lock g holds that does not rank above r.
func (h *held) acquire(g int64, r Rank) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.by[g] {
		if o >= r {
			return fmt.Errorf("lock order: goroutine %d takes %s (rank %d) while holding %s (rank %d): %v",
				g, nameOf(r), r, nameOf(o), o, names(h.by[g]))
		}
	}
	if h.by == nil {
		h.by = map[int64][]Rank{}
	}
	h.by[g] = append(h.by[g], r)
	return nil
}

// release forgets one lock of rank r held by goroutine g (the one that
// took it: a Go mutex may be unlocked by another goroutine).
func (h *held) release(g int64, r Rank) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.by[g]
	if i := slices.Index(s, r); i >= 0 {
		s = slices.Delete(s, i, i+1)
	}
	if len(s) == 0 {
		delete(h.by, g)
	} else {
		h.by[g] = s
	}
}

func nameOf(r Rank) string {
	if r >= 1 && int(r) <= len(Classes) {
		return Name(Classes[r-1])
	}
	return fmt.Sprintf("rank %d", r)
}

func names(rs []Rank) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = nameOf(r)
	}
	return out
}
