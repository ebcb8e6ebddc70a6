package cluster

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"
	"unique"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// Version orders the states of one record. Only the record's owner stamps
// versions. Epoch identifies the owner's incarnation (its start time in ns,
// raised past any higher epoch it finds under its own name), Seq counts the
// owner's changes within the incarnation. Versions compare
// lexicographically, so every record a restarted node writes beats every
// record its previous incarnation wrote.
type Version struct {
	Epoch uint64
	Seq   uint64
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than o.
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.Epoch, o.Epoch); c != 0 {
		return c
	}
	return cmp.Compare(v.Seq, o.Seq)
}

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Epoch, v.Seq) }

// key identifies a record: one endpoint of one network.
type key struct {
	nid, eid string
}

// record is one row of the replicated table. Records in the table are never
// mutated in place once other goroutines could see copies of their slices:
// a change replaces the record (IPs is shared only between records that are
// themselves immutable).
//
// A node holds one per endpoint of its networks: the fields are ordered so
// that the flags fill the MAC's padding, the VTEP, one per host, is
// interned, and the deletion time takes 8 bytes (112 bytes, not 160).
type record struct {
	NetworkID  string
	EndpointID string
	Owner      string // node name of the host holding the endpoint
	Version    Version
	// At, on THIS node's clock, is for a tombstone when the endpoint was
	// deleted (the wire carries its age, not a timestamp, so clock skew
	// between nodes does not stretch or shorten tombstone lifetimes), and
	// for a live record when this node took it in (or stamped it, its
	// own): anti-entropy leaves alone what is younger (sync.go).
	At instant

	// Live records only.
	IPs  []netip.Addr
	VTEP unique.Handle[netip.Addr] // zero: none (see vtep)
	MAC  hwaddr.MAC

	Deleted bool
	// Member marks a network membership record: Owner has NetworkID
	// locally and wants its endpoint records. Its EndpointID is
	// memberEID(Owner), so it shares the table and the merge rules of
	// endpoint records without colliding with any of them.
	Member bool
}

func (r *record) key() key { return key{r.NetworkID, r.EndpointID} }

// vtep is the record's VTEP, invalid if it has none.
func (r *record) vtep() netip.Addr {
	if r.VTEP == (unique.Handle[netip.Addr]{}) {
		return netip.Addr{}
	}
	return r.VTEP.Value()
}

// instant is a time in 8 bytes where a time.Time takes 24: nanoseconds
// since clockBase. Converting there and back keeps the monotonic reading
// of a time that has one (both carry one from the same clock, so the
// difference is taken on it and comes back whole), and the wall time of
// one that has none (an injected clock's): ages taken with now.Sub on the
// cluster's clock come out as they would from the time.Time itself.
type instant int64

// clockBase anchors instants. Any time serves: only differences between
// instants and the cluster's clock's readings are ever used.
var clockBase = time.Now()

func instantOf(t time.Time) instant { return instant(t.Sub(clockBase)) }

func (i instant) time() time.Time { return clockBase.Add(time.Duration(i)) }

// memberEID is the endpoint id of owner's membership record. Endpoint ids
// never start with a NUL byte (validate), so it names no endpoint.
func memberEID(owner string) string { return "\x00" + owner }

func isMemberEID(eid string) bool { return eid != "" && eid[0] == 0 }

// endpoint: a live endpoint record (not a tombstone, not a membership).
func (r *record) endpoint() bool { return r != nil && !r.Deleted && !r.Member }

func (r *record) clone() *record {
	c := *r
	c.IPs = slices.Clone(r.IPs)
	return &c
}

// peer converts a live record into the driver's form.
func (r *record) peer() peerdb.Peer {
	return peerdb.Peer{EndpointID: r.EndpointID, IPs: slices.Clone(r.IPs), MAC: r.MAC, VTEP: r.vtep()}
}

// Epoch bounds. Epochs are start times in ns: 2^62 ns is in the year 2116.
// A node adopts an epoch seen under its own name only below maxSaneEpoch,
// so a corrupt or forged record cannot push it towards overflow; anything
// at or above is superseded by finalVersion, which beats every version the
// wire accepts (epochs below maxWireEpoch).
const (
	maxSaneEpoch = 1 << 62
	maxWireEpoch = 1 << 63
)

var finalVersion = Version{maxWireEpoch - 1, math.MaxUint64}

// Limits on what a record may hold; they keep every single-record message
// far below memberlist's UDP packet budget (1400 bytes by default).
const (
	maxIDLen = 128 // network id, endpoint id, owner name
	maxIPs   = 16
)

// validate checks a record from the network (or from Publish) before it may
// enter the table. Network and endpoint ids follow peerdb.CheckID, the
// driver's rule on every path, so the table holds nothing the driver
// would refuse to delete (tombstones included); owner names follow New's.
func (r *record) validate() error {
	if err := peerdb.CheckID("network", r.NetworkID); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if r.Owner == "" || len(r.Owner) > maxIDLen || strings.ContainsFunc(r.Owner, unicode.IsControl) {
		return fmt.Errorf("record: owner %q is not a node name", r.Owner)
	}
	if r.Member {
		if r.EndpointID != memberEID(r.Owner) {
			return fmt.Errorf("membership record of %s under endpoint id %q", r.Owner, r.EndpointID)
		}
		return nil
	}
	if err := peerdb.CheckID("endpoint", r.EndpointID); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if r.Deleted {
		return nil
	}
	if len(r.IPs) > maxIPs {
		return fmt.Errorf("record %s: %d IPs, at most %d", r.EndpointID, len(r.IPs), maxIPs)
	}
	return r.peer().Validate()
}

// sameContent reports whether two live records carry the same endpoint data.
func sameContent(a, b *record) bool {
	return a.endpoint() && b.endpoint() && a.MAC == b.MAC && a.VTEP == b.VTEP && slices.Equal(a.IPs, b.IPs)
}
