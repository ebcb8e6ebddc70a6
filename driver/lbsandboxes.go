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
// part, and the namespace gets the union.
type lbSandboxes struct {
	// mu guards byPath and serialises the LoadBalancer's calls (one
	// namespace's calls must not overlap). Below network.mu in the lock
	// order: taken with a network's lock held, never the other way; no
	// other lock is taken under it.
	mu     lockrank.Mutex[lockrank.LBSandboxes]
	byPath map[string]map[string][]servicelb.Service // namespace path → network id → services
}

// set makes the namespace at path balance svcs for network nid (nothing
// when svcs is empty) besides what other networks gave it, and programs
// it. Without svcs nothing is done unless nid gave it some before, or
// stale says the namespace may hold what an earlier run programmed.
// Caller holds nid's network lock.
func (s *lbSandboxes) set(lb LoadBalancer, path, nid string, svcs []servicelb.Service, stale bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, had := s.byPath[path][nid]; !had && len(svcs) == 0 && !stale {
		return nil // nothing of nid's there to withdraw
	}
	if s.byPath == nil {
		s.byPath = map[string]map[string][]servicelb.Service{}
	}
	nets := s.byPath[path]
	if nets == nil {
		nets = map[string][]servicelb.Service{}
		s.byPath[path] = nets
	}
	if len(svcs) == 0 {
		delete(nets, nid)
	} else {
		nets[nid] = svcs
	}
	var all []servicelb.Service
	for _, part := range nets {
		all = append(all, part...)
	}
	if len(nets) == 0 {
		delete(s.byPath, path)
	}
	if len(all) == 0 {
		return lb.Remove(path)
	}
	slices.SortFunc(all, func(a, b servicelb.Service) int { return cmp.Compare(a.Name, b.Name) })
	return lb.Apply(path, all)
}

// counters reads the namespace's connection counts, serialised with set.
func (s *lbSandboxes) counters(lb LoadBalancer, path string) (map[servicelb.Backend]uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lb.Counters(path)
}

// forget drops the namespace, gone: nothing to program there any more.
func (s *lbSandboxes) forget(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byPath, path)
}
