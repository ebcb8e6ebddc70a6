package driver

import (
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// planner keeps the books of one network's sandbox entries, in the shape
// of Felix's vxlanfdb: desired state in, kernel work out, resync on any
// error. The desired entries are the remote bindings of the network's peer
// db: a neighbour entry per binding, an FDB entry per (VTEP, MAC) and with
// the flood option a flood entry per VTEP. The planner owns the FDB
// reference counts those imply, and with them the IPsec reference of each
// remote VTEP: one is held exactly while the VTEP has a count.
//
// Apply is the fast path: it turns peer db changes into work without
// reading the kernel. Resync is the reconciler: it recomputes the books
// from the whole peer db and compares them with the kernel's entries. Both
// return a work, which Driver.execute runs in its one order. It is pure: no
// kernel, no encryption. Guarded by the network's mu, like the rest of the
// network.
type planner struct {
	// fdb counts, per remote VTEP, the bindings that use each of its
	// (VTEP, MAC) FDB entries; an entry is in the kernel while its count
	// is positive and a sandbox exists. A VTEP is in the map while it has
	// an entry; with the flood option it has a flood entry as long. (One
	// map per VTEP keyed by MAC is a third of the size of one keyed by
	// both: networks have many endpoints on few hosts.)
	fdb map[netip.Addr]countmap.Map[hwaddr.MAC]
	// buf is Apply's work, reused: programming a peer allocates nothing
	// here.
	buf work
}

// work is what one plan asks of the kernel and of the encryption side, in
// the order Driver.execute runs it: take, ops, release. A remote VTEP's
// IPsec reference is taken before its first FDB entry is written, so its
// traffic is never sent unprotected, and dropped after its last is gone.
type work struct {
	take []netip.Addr
	ops  []kernel.EntryOp
	// release are the remote VTEPs whose last FDB entry goes in ops.
	release []netip.Addr
}

func (w *work) add(op kernel.EntryOp) { w.ops = append(w.ops, op) }

// sandboxEntries are a sandbox's entries as read back from the kernel.
type sandboxEntries struct {
	neighbors []kernel.Neighbor
	fdb       []kernel.FDBEntry
}

func newPlanner() planner {
	return planner{fdb: map[netip.Addr]countmap.Map[hwaddr.MAC]{}}
}

// Apply plans a run of peer db changes. Local owners need no entry: the
// bridge reaches them directly. The FDB entry of a (VTEP, MAC) is added
// with its first binding and removed with its last. The work returned
// shares the planner's buffer: it is valid until the next Apply.
func (pl *planner) Apply(changes []peerdb.Change, flood bool) work {
	w := &pl.buf
	w.take, w.ops, w.release = w.take[:0], w.ops[:0], w.release[:0]
	for _, c := range changes {
		pl.applyOne(c, flood, w)
	}
	return *w
}

func (pl *planner) applyOne(c peerdb.Change, flood bool, w *work) {
	if c.New != nil && !c.New.Local {
		w.add(kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: c.IP, MAC: c.New.MAC}})
		e := kernel.FDBEntry{MAC: c.New.MAC, VTEP: c.New.VTEP}
		macs := pl.fdb[e.VTEP]
		if macs == nil {
			macs = countmap.Map[hwaddr.MAC]{}
			pl.fdb[e.VTEP] = macs
		}
		if macs.Add(e.MAC, 1) == 1 {
			if len(macs) == 1 {
				w.take = append(w.take, e.VTEP)
				if flood {
					w.add(kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{VTEP: e.VTEP}})
				}
			}
			w.add(kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: e})
		}
	} else if c.Old != nil && !c.Old.Local {
		w.add(kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: c.IP}})
	}
	if c.Old != nil && !c.Old.Local {
		e := kernel.FDBEntry{MAC: c.Old.MAC, VTEP: c.Old.VTEP}
		macs := pl.fdb[e.VTEP] // nil, and a count of -1, if it had none
		if macs.Add(e.MAC, -1) == 0 {
			w.add(kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: e})
			// The kernel holds one unicast entry per MAC, the last one
			// written: if another VTEP's binding of the MAC remains (two
			// hosts claim it, for a while or by mistake), it is written
			// again rather than lost until the next resync.
			if other, ok := pl.holder(e.MAC, e.VTEP); ok {
				w.add(kernel.EntryOp{Kind: kernel.OpAddFDB, FDB: kernel.FDBEntry{MAC: e.MAC, VTEP: other}})
			}
			if len(macs) == 0 {
				delete(pl.fdb, e.VTEP)
				if flood {
					w.add(kernel.EntryOp{Kind: kernel.OpDeleteFDB, FDB: kernel.FDBEntry{VTEP: e.VTEP}})
				}
				w.release = append(w.release, e.VTEP)
			}
		}
	}
}

// holder is a VTEP other than not with a binding of mac. Only deletes
// that empty a (VTEP, MAC) ask, so the walk is over the few VTEPs.
func (pl *planner) holder(mac hwaddr.MAC, not netip.Addr) (netip.Addr, bool) {
	for vtep, macs := range pl.fdb {
		if vtep != not && macs[mac] > 0 {
			return vtep, true
		}
	}
	return netip.Addr{}, false
}

// Resync recomputes the books from the peer db's bindings and plans what
// makes the sandbox's entries (actual) match them; an entry nothing wants
// is removed if removable says so of the VTEP it points at (invalid:
// unknown). Each repair is noted in p. With actual nil (the kernel could
// not be read) it settles the books and the IPsec references only.
func (pl *planner) Resync(bindings map[netip.Addr]peerdb.Binding, actual *sandboxEntries, flood bool,
	removable func(netip.Addr) bool, p *pass) work {
	wantN := map[netip.Addr]hwaddr.MAC{}
	want := map[netip.Addr]countmap.Map[hwaddr.MAC]{}
	for ip, b := range bindings {
		if b.Local {
			continue
		}
		wantN[ip] = b.MAC
		macs := want[b.VTEP]
		if macs == nil {
			macs = countmap.Map[hwaddr.MAC]{}
			want[b.VTEP] = macs
		}
		macs.Add(b.MAC, 1)
	}
	var w work
	for vtep := range want {
		if pl.fdb[vtep] == nil {
			w.take = append(w.take, vtep)
		}
	}
	for vtep := range pl.fdb {
		if want[vtep] == nil {
			w.release = append(w.release, vtep)
		}
	}
	pl.fdb = want
	if actual != nil {
		w.ops = pl.repairs(wantN, actual, flood, removable, p)
	}
	return w
}

// repairs compares the sandbox's entries with the wanted neighbours and
// the books, and returns the ops that repair the difference, in the order
// they must go to the kernel.
func (pl *planner) repairs(wantN map[netip.Addr]hwaddr.MAC, actual *sandboxEntries, flood bool,
	removable func(netip.Addr) bool, p *pass) []kernel.EntryOp {
	wantF := map[kernel.FDBEntry]bool{}
	unicast := map[hwaddr.MAC]netip.Addr{}
	for vtep, macs := range pl.fdb {
		for mac := range macs {
			wantF[kernel.FDBEntry{MAC: mac, VTEP: vtep}] = true
			unicast[mac] = vtep
		}
		if flood {
			wantF[kernel.FDBEntry{VTEP: vtep}] = true
		}
	}
	// The VTEP each MAC is sent to now, for the neighbours nothing wants:
	// built only if there is one.
	var sentTo map[hwaddr.MAC]netip.Addr
	vtepOf := func(mac hwaddr.MAC) netip.Addr {
		if sentTo == nil {
			sentTo = make(map[hwaddr.MAC]netip.Addr, len(actual.fdb))
			for _, e := range actual.fdb {
				if !e.MAC.IsZero() {
					sentTo[e.MAC] = e.VTEP
				}
			}
		}
		return sentTo[mac]
	}
	var ops []kernel.EntryOp
	setN := func(ip netip.Addr, mac hwaddr.MAC) {
		ops = append(ops, kernel.EntryOp{Kind: kernel.OpSetNeighbor, Neighbor: kernel.Neighbor{IP: ip, MAC: mac}})
	}
	fdbOp := func(kind kernel.EntryOpKind, e kernel.FDBEntry) {
		ops = append(ops, kernel.EntryOp{Kind: kind, FDB: e})
	}
	for _, nb := range actual.neighbors {
		mac, ok := wantN[nb.IP]
		switch {
		case ok && mac == nb.MAC && !nb.NotPermanent:
			delete(wantN, nb.IP)
		case ok:
			delete(wantN, nb.IP)
			setN(nb.IP, mac)
			p.note(RepairNeighborReplaced, "%s was %s%s, want %s", nb.IP, nb.MAC, notPermanent(nb.NotPermanent), mac)
		case removable(vtepOf(nb.MAC)):
			ops = append(ops, kernel.EntryOp{Kind: kernel.OpDeleteNeighbor, Neighbor: kernel.Neighbor{IP: nb.IP}})
			p.note(RepairNeighborRemoved, "%s %s%s wanted by no endpoint", nb.IP, nb.MAC, notPermanent(nb.NotPermanent))
		}
	}
	for ip, mac := range wantN {
		setN(ip, mac)
		p.note(RepairNeighborAdded, "%s %s was missing", ip, mac)
	}
	replaced := map[hwaddr.MAC]bool{} // unicast MACs pointing elsewhere
	for _, e := range actual.fdb {
		key := kernel.FDBEntry{MAC: e.MAC, VTEP: e.VTEP}
		vtep, macWanted := unicast[e.MAC]
		switch {
		case wantF[key] && !e.NotPermanent:
			delete(wantF, key)
		case wantF[key]:
			// A NOARP twin of ours: appending cannot change its state.
			fdbOp(kernel.OpDeleteFDB, key)
			delete(wantF, key)
			fdbOp(kernel.OpAddFDB, key)
			p.note(RepairFDBReplaced, "%s dst %s was not permanent", e.MAC, e.VTEP)
		case macWanted && !e.MAC.IsZero():
			// Adding the wanted entry below replaces this one.
			replaced[e.MAC] = true
			p.note(RepairFDBReplaced, "%s dst %s%s, want dst %s", e.MAC, e.VTEP, notPermanent(e.NotPermanent), vtep)
		case removable(e.VTEP):
			fdbOp(kernel.OpDeleteFDB, key)
			p.note(RepairFDBRemoved, "%s dst %s%s wanted by no endpoint", e.MAC, e.VTEP, notPermanent(e.NotPermanent))
		}
	}
	for e := range wantF {
		fdbOp(kernel.OpAddFDB, e)
		if !replaced[e.MAC] || e.MAC.IsZero() {
			p.note(RepairFDBAdded, "%s dst %s was missing", e.MAC, e.VTEP)
		}
	}
	return ops
}

// wantsFDB reports whether the books want FDB entry e in the sandbox.
func (pl *planner) wantsFDB(e kernel.FDBEntry, flood bool) bool {
	macs := pl.fdb[e.VTEP]
	if e.MAC.IsZero() {
		return flood && macs != nil
	}
	return macs[e.MAC] > 0
}

// Reset empties the books, as a sandbox that goes or is built anew needs,
// and returns the remote VTEPs whose IPsec references go with them.
func (pl *planner) Reset() (release []netip.Addr) {
	for vtep := range pl.fdb {
		release = append(release, vtep)
	}
	clear(pl.fdb)
	return release
}

func notPermanent(b bool) string {
	if b {
		return " (not permanent)"
	}
	return ""
}
