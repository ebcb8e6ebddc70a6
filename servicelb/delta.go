package servicelb

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// A delta takes a table that holds exactly one list of services to one
// that holds another, touching only the services that differ: their VIP's
// element, their pick map's elements, their service chain's rule, and the
// chains of the backends added or removed. Backends that stay keep their
// chains, hence their counters; the batch's size depends on the change,
// not on the number of services.
type delta struct {
	pairs []servicePair
}

// servicePair is one VIP's service before and after; nil for none.
type servicePair struct{ old, new *Service }

// diff compares two normalized lists. It fails (ok false) where the
// change is not a delta's to make: a service renamed keeps its VIP, and
// its comments would need its backends' chains rebuilt with their
// counters, which only the full replace carries over.
func diff(old, new []Service) (d delta, ok bool) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		var p servicePair
		switch {
		case j == len(new) || (i < len(old) && old[i].VIP.Less(new[j].VIP)):
			p.old = &old[i]
			i++
		case i == len(old) || new[j].VIP.Less(old[i].VIP):
			p.new = &new[j]
			j++
		default:
			p.old, p.new = &old[i], &new[j]
			i, j = i+1, j+1
			if p.old.Name != p.new.Name {
				return delta{}, false
			}
			if slices.Equal(p.old.Backends, p.new.Backends) {
				continue
			}
		}
		d.pairs = append(d.pairs, p)
	}
	return d, true
}

// queue queues the delta on c, in an order the kernel accepts inside one
// batch: chains before the elements that jump to them, elements deleted
// before the chains they jump to. It returns the number of objects
// (chains, rules, sets, elements) written, and the backends removed.
func (d delta) queue(c *nftables.Conn) (objects int, removed []Backend, err error) {
	q := &queuer{c: c, b: &builder{rs: &ruleset{table: newTable()}}}
	for _, p := range d.pairs {
		q.service(p)
		removed = append(removed, gone(p)...)
	}
	return q.objects, removed, q.err
}

// gone lists the backends of p.old that p.new lacks.
func gone(p servicePair) []Backend {
	var out []Backend
	if p.old == nil {
		return nil
	}
	for _, a := range p.old.Backends {
		if p.new == nil || !slices.Contains(p.new.Backends, a) {
			out = append(out, Backend{VIP: p.old.VIP, Addr: a})
		}
	}
	return out
}

// queuer queues a delta's messages and counts its objects; the first
// error sticks.
type queuer struct {
	c       *nftables.Conn
	b       *builder // for new services' chains and maps, and set IDs
	objects int
	err     error
}

func (q *queuer) elements(s *nftables.Set, add bool, elems ...nftables.SetElement) {
	if len(elems) == 0 || q.err != nil {
		return
	}
	s.Table = q.b.rs.table
	q.objects += len(elems)
	for rest := elems; len(rest) > 0; rest = rest[min(len(rest), elemsPerMessage):] {
		part := rest[:min(len(rest), elemsPerMessage)]
		var err error
		if add {
			err = q.c.SetAddElements(s, part)
		} else {
			err = q.c.SetDeleteElements(s, part)
		}
		if err != nil {
			q.err = fmt.Errorf("queue elements of %s: %w", s.Name, err)
		}
	}
}

func (q *queuer) addChain(cs chainSpec) {
	cs.chain.Table = q.b.rs.table
	q.c.AddChain(cs.chain)
	q.objects++
	q.addRules(cs)
}

func (q *queuer) addRules(cs chainSpec) {
	for _, r := range cs.rules {
		q.c.AddRule(&nftables.Rule{Table: q.b.rs.table, Chain: cs.chain, Exprs: r.exprs, UserData: nftutil.Comment(r.comment)})
		q.objects++
	}
}

func (q *queuer) delChain(name string) {
	q.c.DelChain(&nftables.Chain{Name: name, Table: q.b.rs.table})
	q.objects++
}

// service queues one VIP's change.
func (q *queuer) service(p servicePair) {
	o, n := p.old, p.new
	vip := o
	if vip == nil {
		vip = n
	}
	f := familyOf(vip.VIP)
	vips := &nftables.Set{Name: f.vips, IsMap: true, KeyType: f.addrType, DataType: nftables.TypeVerdict}
	empty := &nftables.Set{Name: f.empty, KeyType: f.addrType}
	key := vip.VIP.AsSlice()
	hadBackends, hasBackends := o != nil && len(o.Backends) > 0, n != nil && len(n.Backends) > 0
	switch {
	case hadBackends && hasBackends:
		q.backends(*o, *n, f)
		return
	case hadBackends:
		q.elements(vips, false, gotoElem(key, serviceName(o.VIP)))
		q.delChain(serviceName(o.VIP))
		q.c.DelSet(&nftables.Set{Name: serviceName(o.VIP), Table: q.b.rs.table})
		q.objects++
		for _, a := range o.Backends {
			q.delChain(backendName(Backend{VIP: o.VIP, Addr: a}))
		}
	case o != nil:
		q.elements(empty, false, nftables.SetElement{Key: key})
	}
	switch {
	case hasBackends:
		q.newService(*n, f)
		q.elements(vips, true, gotoElem(key, serviceName(n.VIP)))
	case n != nil:
		q.elements(empty, true, nftables.SetElement{Key: key})
	}
}

// newService queues the chains and pick map of a service with backends,
// as a full build makes them (counters from zero).
func (q *queuer) newService(s Service, f family) {
	from := len(q.b.rs.chains)
	fromSet := len(q.b.rs.sets)
	q.b.addService(s, f, map[Backend]expr.Counter{})
	chains := q.b.rs.chains[from:]
	for _, cs := range chains {
		q.c.AddChain(cs.chain)
		q.objects++
	}
	for _, ss := range q.b.rs.sets[fromSet:] {
		if err := q.c.AddSet(ss.set, nil); err != nil && q.err == nil {
			q.err = fmt.Errorf("queue set %s: %w", ss.set.Name, err)
		}
		q.objects++
		q.elements(ss.set, true, ss.elems...)
	}
	for _, cs := range chains {
		q.addRules(cs)
	}
}

// backends queues the change of a service that has backends before and
// after: chains for the backends added, the pick map's elements that
// differ, the service chain's rule if the number of backends changed,
// and the removal of the chains of the backends removed.
func (q *queuer) backends(o, n Service, f family) {
	for _, a := range n.Backends {
		if !slices.Contains(o.Backends, a) {
			q.addChain(backendChain(n, a, f, expr.Counter{}))
		}
	}
	m := pickMap(n.VIP)
	var del, add []nftables.SetElement
	for i := range max(len(o.Backends), len(n.Backends)) {
		if i < len(o.Backends) && i < len(n.Backends) && o.Backends[i] == n.Backends[i] {
			continue
		}
		if i < len(o.Backends) {
			del = append(del, pick(o, i))
		}
		if i < len(n.Backends) {
			add = append(add, pick(n, i))
		}
	}
	q.elements(m, false, del...)
	q.elements(m, true, add...)
	if len(o.Backends) != len(n.Backends) {
		svc := &nftables.Chain{Name: serviceName(n.VIP), Table: q.b.rs.table}
		q.c.FlushChain(svc)
		q.objects++
		q.addRules(chainSpec{chain: svc, rules: []ruleSpec{pickRule(n, m)}})
	}
	for _, a := range o.Backends {
		if !slices.Contains(n.Backends, a) {
			q.delChain(backendName(Backend{VIP: o.VIP, Addr: a}))
		}
	}
}
