package driver

import (
	"cmp"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
)

// lbSandboxes is what each container namespace balances, by network. A
// container on two of the plugin's networks has one table holding both
// networks' services: each network's programming replaces only its own
// part, and the namespace gets the union. Namespaces are programmed in
// parallel (balance), each one's calls one at a time.
type lbSandboxes struct {
	// mu guards byPath and each entry's users. A leaf: taken under
	// network.mu, never with an lbNamespace's lock held.
	mu     lockrank.Mutex[lockrank.LBPaths]
	byPath map[string]*lbNamespace
}

// lbNamespace is one container namespace's part of lbSandboxes.
type lbNamespace struct {
	// mu guards nets and serialises the LoadBalancer's calls in this
	// namespace (they must not overlap). Taken under network.mu; the
	// LoadBalancer's own lock (LBTables) is taken under it.
	mu   lockrank.Mutex[lockrank.LBSandboxes]
	nets map[string][]servicelb.Service // network id → services
	// users counts the calls that hold or wait for mu, guarded by
	// lbSandboxes.mu: an entry is removed only when it has none, so no
	// two entries of one namespace ever exist at once.
	users int
	gone  bool // the namespace is gone: remove the entry once unused
}

// acquire returns path's entry, locked.
func (s *lbSandboxes) acquire(path string) *lbNamespace {
	s.mu.Lock()
	if s.byPath == nil {
		s.byPath = map[string]*lbNamespace{}
	}
	e := s.byPath[path]
	if e == nil {
		e = &lbNamespace{nets: map[string][]servicelb.Service{}}
		s.byPath[path] = e
	}
	e.users++
	s.mu.Unlock()
	e.mu.Lock()
	return e
}

// release unlocks path's entry e, and removes it if it is unused and
// empty or gone. seen says the call reached the namespace: one there now
// (a container took the path again) is not gone, whatever forget said
// while the call waited. With no users nobody holds e.mu, so e.nets is
// read safely here.
func (s *lbSandboxes) release(path string, e *lbNamespace, seen bool) {
	e.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if seen {
		e.gone = false
	}
	if e.users--; e.users == 0 && (len(e.nets) == 0 || e.gone) {
		delete(s.byPath, path)
	}
}

// set makes the namespace at path balance svcs for network nid (nothing
// when svcs is empty) besides what other networks gave it, and programs
// it. Without svcs nothing is done unless nid gave it some before, or
// stale says the namespace may hold what an earlier run programmed.
// Caller holds nid's network lock, or waits for the goroutine it started
// to call set (balance).
func (s *lbSandboxes) set(lb LoadBalancer, path, nid string, svcs []servicelb.Service, stale bool) (err error) {
	e := s.acquire(path)
	called := false
	defer func() { s.release(path, e, called && err == nil) }()
	if _, had := e.nets[nid]; !had && len(svcs) == 0 && !stale {
		return nil // nothing of nid's there to withdraw
	}
	called = true
	if len(svcs) == 0 {
		delete(e.nets, nid)
	} else {
		e.nets[nid] = svcs
	}
	var all []servicelb.Service
	for _, part := range e.nets {
		all = append(all, part...)
	}
	if len(all) == 0 {
		return lb.Remove(path)
	}
	slices.SortFunc(all, func(a, b servicelb.Service) int { return cmp.Compare(a.Name, b.Name) })
	return lb.Apply(path, all)
}

// counters reads the namespace's connection counts, serialised with set.
func (s *lbSandboxes) counters(lb LoadBalancer, path string) (map[servicelb.Backend]uint64, error) {
	e := s.acquire(path)
	c, err := lb.Counters(path)
	s.release(path, e, err == nil)
	return c, err
}

// forget drops the namespace, gone: nothing to program there any more.
func (s *lbSandboxes) forget(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.byPath[path]; e != nil {
		if e.users == 0 {
			delete(s.byPath, path)
		} else {
			e.gone = true
		}
	}
}
