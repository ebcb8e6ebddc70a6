package controlplane

import (
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// keyRelay holds what the members tell of their keys (their public keys,
// cluster.Config.NodeData; the ids of their cluster secrets,
// cluster.Config.MemberKeyIDs) until the IPsec manager that takes it
// exists: a first run settles its VXLAN port, which the manager needs,
// only after it joined. It keeps the latest of each member's, which is
// what the manager would end with; each member's reach it in the order
// they came.
type keyRelay[T any] struct {
	// mu guards to and held. A leaf: nothing is called under it.
	mu   lockrank.Mutex[lockrank.KeyRelay]
	to   func(netip.Addr, T)
	held map[netip.Addr]T
}

// relays are the two a control plane with a secret has.
type relays struct {
	public  keyRelay[[]byte]
	secrets keyRelay[[]string]
}

// deliver passes a member's keys on, or holds them until attach. The
// cluster calls it from one goroutine per relay.
func (r *keyRelay[T]) deliver(a netip.Addr, data T) {
	r.mu.Lock()
	to := r.to
	if to == nil {
		if r.held == nil {
			r.held = map[netip.Addr]T{}
		}
		r.held[a] = data
	}
	r.mu.Unlock()
	if to != nil {
		to(a, data)
	}
}

// attach hands what was held to to, and from then on everything that
// comes: keys that arrive while the held ones are handed over are held
// too, and handed over after them.
func (r *keyRelay[T]) attach(to func(netip.Addr, T)) {
	for {
		r.mu.Lock()
		held := r.held
		r.held = nil
		if len(held) == 0 {
			r.to = to
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		for a, data := range held {
			to(a, data)
		}
	}
}
