package kernel

// The echoes of Program's FDB changes. Every change is notified to the
// sandbox's watches, and the VXLAN FDB's notifications carry no sender
// (unlike the neighbour ones, dropped by port id: watchsock.go), so
// without this each programmed entry came back as an event for the
// driver to check under the network's lock.
//
// Program records what each FDB request will make the entry (echoes),
// and a watch drops an event that says exactly that, once. Anything
// else about the entry is reported and forgets the record: an outside
// change before our request (its event differs from ours: NOARP, another
// state, a deletion) or after it (our echo came first and was consumed)
// is reported either way. A record whose echo never comes (a no-op
// replace, a lost event) is stale; it still only says what the driver
// wanted the entry to be when it last programmed it, and the next
// request for the entry replaces it. Only the last request's outcome is
// kept: while requests of different outcome for one entry are in flight
// together (delete and re-add), the earlier echo is reported, which
// costs a pass of the reconciler, not correctness.

import (
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// maxEchoes bounds the records of a sandbox: when full, they are all
// dropped (their echoes are then reported, which costs time, not
// correctness).
const maxEchoes = 1 << 16

type echoKey struct {
	idx  int
	mac  hwaddr.MAC
	vtep netip.Addr
}

// echo is the event expected: n more of them, a deletion or an addition
// of a permanent entry.
type echo struct {
	deleted bool
	n       uint32
}

type echoes struct {
	// mu guards m. A leaf: taken under pipeline.mu while a window is
	// sent (expect), and alone by the watches (seen) and on failures.
	mu lockrank.Mutex[lockrank.Echoes]
	m  map[echoKey]echo // nil when empty, so a burst's map is freed
}

func echoKeyOf(idx int, e *FDBEntry) echoKey {
	return echoKey{idx: idx, mac: e.MAC, vtep: e.VTEP.Unmap()}
}

// expect records the echo of op, an FDB request sent to the device idx.
// Caller holds x.mu.
func (x *echoes) expect(idx int, op *EntryOp) {
	k := echoKeyOf(idx, &op.FDB)
	del := op.Kind == OpDeleteFDB
	if x.m == nil {
		x.m = map[echoKey]echo{}
	}
	if e, ok := x.m[k]; ok && e.deleted == del {
		e.n++
		x.m[k] = e
		return
	}
	if len(x.m) >= maxEchoes {
		x.m = map[echoKey]echo{}
	}
	x.m[k] = echo{deleted: del, n: 1}
}

// forget drops the record of the entry of a failed request.
func (x *echoes) forget(idx int, op *EntryOp) {
	x.mu.Lock()
	x.drop(echoKeyOf(idx, &op.FDB))
	x.mu.Unlock()
}

// seen reports whether an event about the FDB entry e of the device idx
// is an echo of ours, consuming it.
func (x *echoes) seen(idx int, e *FDBEntry, deleted bool) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	k := echoKeyOf(idx, e)
	r, ok := x.m[k]
	if !ok {
		return false
	}
	ours := r.deleted == deleted && (deleted || !e.NotPermanent)
	if ours && r.n > 1 {
		r.n--
		x.m[k] = r
		return true
	}
	x.drop(k)
	return ours
}

func (x *echoes) drop(k echoKey) {
	if delete(x.m, k); len(x.m) == 0 {
		x.m = nil
	}
}
