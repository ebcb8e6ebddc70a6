package driver

import (
	"cmp"
	"slices"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Swarm creates a network asynchronously: `docker network create` returns
// before any host has seen it, so a host that cannot serve it (an
// encrypted network without a secret or without ESP in the kernel) can
// tell the user only through the failed task (`docker service ps
// --no-trunc`) and its own log. The driver also remembers such refusals,
// so that `overlay-plugin state` and the metrics name the network and why.

// maxRefusals bounds the memory of refused networks: Docker retries a
// refused network for every task it schedules, and the ids a user tried
// and removed are never announced to the plugin.
const maxRefusals = 64

// Refusal is a network this host refused to serve.
type Refusal struct {
	// Reason is the error Docker was given.
	Reason string `json:"reason"`
	// Count is how many of Docker's calls were refused; Last the latest.
	Count int       `json:"count"`
	Last  time.Time `json:"last"`
}

// refusals remembers the latest refusals by network id.
type refusals struct {
	// mu guards m. A leaf: taken under a network's lock (Join) or none,
	// with nothing locked or called under it.
	mu lockrank.Mutex[lockrank.Refusals]
	m  map[string]Refusal
}

// record notes that network id was refused with err, forgetting the
// oldest refusal when there are too many.
func (r *refusals) record(id string, err error, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]Refusal{}
	}
	old, ok := r.m[id]
	if !ok && len(r.m) >= maxRefusals {
		oldest := ""
		for k, v := range r.m {
			if oldest == "" || v.Last.Before(r.m[oldest].Last) {
				oldest = k
			}
		}
		delete(r.m, oldest)
	}
	r.m[id] = Refusal{Reason: err.Error(), Count: old.Count + 1, Last: now}
}

// take forgets the refusal of network id (one this host serves now, or
// deleted), saying whether there was one.
func (r *refusals) take(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.m[id]
	delete(r.m, id)
	return ok
}

// refusedNetwork is one entry of refusals.list.
type refusedNetwork struct {
	id string
	Refusal
}

// list returns copies of the refusals, sorted by network id.
func (r *refusals) list() []refusedNetwork {
	r.mu.Lock()
	out := make([]refusedNetwork, 0, len(r.m))
	for id, v := range r.m {
		out = append(out, refusedNetwork{id, v})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b refusedNetwork) int { return cmp.Compare(a.id, b.id) })
	return out
}
