package cluster

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"
	"unique"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// Wire format (all integers are unsigned varints unless stated):
//
//	message  = magic(1 byte 0xC7) version(1 byte) kind(1 byte) body
//	body     = records                                   kindRecords, kindState, kindPush
//	         | string(sender) nSyncs sync{nSyncs} records kindSync
//	         | string(node) epoch                        kindRestart (version 3 on)
//	         | string(node) epoch vxlanPort underlayMTU swarm  kindSettings (version 3 on)
//	           [nKeyIDs string(keyID){nKeyIDs}]
//	records  = nOwners owner{nOwners} nNets net{nNets}
//	net      = string(networkID) nRecs rec{nRecs}
//	rec      = flags(1 byte; bit0 deleted, bit1 membership)
//	           string(endpointID)                        unless a membership
//	           ownerIndex epoch seq
//	           ageMillis                                 if deleted
//	           mac(6 bytes) addr(vtep) nIPs addr{nIPs}   if a live endpoint
//	sync     = string(networkID) level(1 byte)
//	           ( count hash                              level 0: the network's digest
//	           | nGroups (string(owner) count hash){nGroups} ) levels 1, 2: per owner
//	hash     = 8 bytes, big endian
//	string   = uvarint(len<<1 | packed) bytes   // packed: even-length lowercase
//	                                            // hex stored as len raw bytes
//	addr     = 1 byte length (4 or 16) + bytes
//
// kindRecords is one membership broadcast by gossip. kindPush is a batch
// of records an owner sends straight to the members of their network.
// kindState is memberlist's push/pull state: every membership
// record. kindSync is anti-entropy (sync.go): digests, and the records
// where digests differed. Owner names are interned per message. Docker's
// 64-hex ids pack to 33 bytes, so an endpoint record costs about 55 bytes
// (before memberlist's own compression). Decoding never panics: every
// length is bounded by the bytes remaining and the limits of validate.
//
// # Versions
//
// This build speaks wire versions wireMin..wireMax and says so in
// memberlist's delegate protocol fields (New). Version 2 is release
// 0.1.0's, its only one. Version 3 is version 2 plus kindRestart (a node
// stopped on purpose announces its restart, restart.go) and kindSettings
// (a node's VXLAN port and underlay MTU, settings.go), and each owner
// digest of kindSync carries the sender's high-water mark of the owner
// (shipment.go); every other kind version 2 has is byte-identical in
// version 3 but for the version byte.
// A message to one node is sent at the newest version both speak, a
// broadcast at wireBroadcast (wire.go says why), and a decoder refuses a
// version outside its range and a kind the message's version does not
// have. A future version that changes the body of an existing kind must
// encode it per version.
//
// wireBroadcast moves one release after the version it names: a release
// that adds version N keeps broadcasting N-1 (the newest the previous
// release decodes); the next broadcasts N, and still decodes N-1 from
// the release before it. So every two adjacent releases understand each
// other's broadcasts, whatever memberlist piggybacks them on.
const (
	wireMagic     = 0xC7
	wireMin       = 2 // 0.1.0's only version
	wireMax       = 3 // adds kindRestart, kindSettings
	wireBroadcast = 2 // 0.1.0's newest: broadcasts of 0.2.0

	kindRecords  = 1
	kindState    = 2
	kindSync     = 3
	kindPush     = 4
	kindRestart  = 5 // version 3 on
	kindSettings = 6 // version 3 on

	kindRestartVersion = 3 // the version that introduced kindRestart
	wireSyncMarks      = 3 // the version whose sync owner digests carry a high-water mark (shipment.go)

	flagDeleted = 1
	flagMember  = 2
)

var errTruncated = errors.New("truncated message")

// kindSince is the wire version that introduced kind (0: no version has it).
func kindSince(kind byte) byte {
	switch kind {
	case kindRecords, kindState, kindSync, kindPush:
		return 2
	case kindRestart, kindSettings:
		return kindRestartVersion
	}
	return 0
}

// versionError is a message whose version byte is outside the range the
// decoder speaks: refused under RejectWireVersion, not as malformed.
type versionError struct{ v, lo, hi byte }

func (e *versionError) Error() string {
	return fmt.Sprintf("unsupported wire version %d (this node speaks %d..%d)", e.v, e.lo, e.hi)
}

type encoder struct{ b []byte }

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

func (e *encoder) str(s string) {
	if packableHex(s) {
		e.uvarint(uint64(len(s)/2)<<1 | 1)
		e.b, _ = hex.AppendDecode(e.b, []byte(s)) // packableHex: cannot fail
		return
	}
	e.uvarint(uint64(len(s)) << 1)
	e.b = append(e.b, s...)
}

func (e *encoder) addr(a netip.Addr) {
	switch {
	case a.Is4():
		e.b = append(e.b, 4)
		v := a.As4()
		e.b = append(e.b, v[:]...)
	case a.Is6():
		e.b = append(e.b, 16)
		v := a.As16()
		e.b = append(e.b, v[:]...)
	default:
		e.b = append(e.b, 0)
	}
}

// packableHex: hex.AppendEncode gives back exactly s.
func packableHex(s string) bool {
	if len(s) == 0 || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// encodeRecords encodes recs as one message of the given kind at the
// lowest version (see encodeRecordsAt).
func encodeRecords(kind byte, recs []*record, now time.Time) []byte {
	return encodeRecordsAt(wireMin, kind, recs, now)
}

// encodeRecordsAt encodes recs as one message of the given kind at wire
// version v. recs must be grouped by network (consecutive records of a
// network); ages of tombstones are computed against now.
func encodeRecordsAt(v, kind byte, recs []*record, now time.Time) []byte {
	e := encoder{b: make([]byte, 0, 64+64*len(recs))}
	e.b = append(e.b, wireMagic, v, kind)
	e.records(recs, now)
	return e.b
}

// records appends the records section; recs must be grouped by network.
func (e *encoder) records(recs []*record, now time.Time) {
	owners := map[string]uint64{}
	var order []string
	for _, r := range recs {
		if _, ok := owners[r.Owner]; !ok {
			owners[r.Owner] = uint64(len(order))
			order = append(order, r.Owner)
		}
	}
	e.uvarint(uint64(len(order)))
	for _, o := range order {
		e.str(o)
	}
	// Count network groups.
	nNets := 0
	for i := range recs {
		if i == 0 || recs[i].NetworkID != recs[i-1].NetworkID {
			nNets++
		}
	}
	e.uvarint(uint64(nNets))
	for i := 0; i < len(recs); {
		j := i
		for j < len(recs) && recs[j].NetworkID == recs[i].NetworkID {
			j++
		}
		e.str(recs[i].NetworkID)
		e.uvarint(uint64(j - i))
		for _, r := range recs[i:j] {
			encodeRecord(e, r, owners[r.Owner], now)
		}
		i = j
	}
}

func encodeRecord(e *encoder, r *record, owner uint64, now time.Time) {
	var flags byte
	if r.Deleted {
		flags |= flagDeleted
	}
	if r.Member {
		flags |= flagMember
	}
	e.b = append(e.b, flags)
	if !r.Member {
		e.str(r.EndpointID)
	}
	e.uvarint(owner)
	e.uvarint(r.Version.Epoch)
	e.uvarint(r.Version.Seq)
	if r.Deleted {
		age := max(now.Sub(r.At.time()), 0)
		e.uvarint(uint64(age / time.Millisecond))
		return
	}
	if r.Member {
		return
	}
	e.b = append(e.b, r.MAC[:]...)
	e.addr(r.vtep())
	e.uvarint(uint64(len(r.IPs)))
	for _, ip := range r.IPs {
		e.addr(ip)
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail(errTruncated)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errTruncated)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a count of items that each take at least minSize bytes, so
// a forged count cannot make the decoder allocate more than the message.
func (d *decoder) count(minSize int) int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(len(d.b)/minSize) {
		d.fail(fmt.Errorf("count %d exceeds message", v))
		return 0
	}
	return int(v)
}

func (d *decoder) str() string {
	h := d.uvarint()
	if d.err != nil {
		return ""
	}
	n, packed := h>>1, h&1 == 1
	limit := uint64(maxIDLen)
	if packed {
		limit /= 2
	}
	if n > limit {
		d.fail(fmt.Errorf("string of %d bytes too long", n))
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(errTruncated)
		return ""
	}
	raw := d.b[:n]
	d.b = d.b[n:]
	if packed {
		return hex.EncodeToString(raw)
	}
	return string(raw)
}

func (d *decoder) addr() netip.Addr {
	n := int(d.byte())
	if d.err != nil {
		return netip.Addr{}
	}
	if n != 0 && n != 4 && n != 16 {
		d.fail(fmt.Errorf("address length %d", n))
		return netip.Addr{}
	}
	if n > len(d.b) {
		d.fail(errTruncated)
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(d.b[:n])
	d.b = d.b[n:]
	return a.Unmap()
}

// message is a decoded message.
type message struct {
	version byte
	kind    byte
	from    string      // kindSync: the sender's node name, for the reply; kindRestart: the node restarting
	epoch   uint64      // kindRestart: the instance that restarts; kindSettings: the sender's
	adv     Settings    // kindSettings
	keyIDs  []string    // kindSettings: the sender's secrets, primary first
	syncs   []syncEntry // kindSync
	recs    []*record
}

// decodeMessage decodes a message of any version this build speaks.
func decodeMessage(buf []byte, now time.Time) (*message, error) {
	return decodeMessageUpTo(buf, now, wireMax)
}

// decodeMessageUpTo decodes a message from the network whose version is
// wireMin..hi (a *versionError otherwise). Each record is checked with
// validate; the first problem fails the whole message (a peer that sends
// garbage gets none of its message applied). Tombstone ages are turned
// into At on now's clock.
func decodeMessageUpTo(buf []byte, now time.Time, hi byte) (*message, error) {
	d := decoder{b: buf}
	if d.byte() != wireMagic || d.err != nil {
		return nil, errors.New("bad magic")
	}
	v := d.byte()
	if d.err != nil {
		return nil, d.err
	}
	if v < wireMin || v > hi {
		return nil, &versionError{v, wireMin, hi}
	}
	m := &message{version: v, kind: d.byte()}
	if d.err != nil {
		return nil, d.err
	}
	if since := kindSince(m.kind); since == 0 || since > v {
		return nil, fmt.Errorf("message kind %d unknown in wire version %d", m.kind, v)
	}
	switch m.kind {
	case kindRecords, kindState, kindPush:
	case kindSync:
		m.from = d.str()
		m.syncs = d.syncs(v)
	case kindRestart, kindSettings:
		m.from = d.str()
		m.epoch = d.uvarint()
		if d.err == nil && (m.from == "" || m.epoch == 0) {
			return nil, errors.New("restart announcement or settings without a node or epoch")
		}
		if m.kind == kindSettings {
			port, mtu, swarm := d.uvarint(), d.uvarint(), d.uvarint()
			if d.err == nil {
				if m.adv, d.err = checkSettings(port, mtu, swarm); d.err != nil {
					return nil, d.err
				}
			}
			if d.err == nil && len(d.b) > 0 { // none from a build before keyrings
				m.keyIDs = d.keyIDs()
			}
		}
		if d.err != nil {
			return nil, d.err
		}
		if len(d.b) != 0 {
			return nil, fmt.Errorf("%d trailing bytes", len(d.b))
		}
		return m, nil
	}
	recs, err := d.records(now)
	if err != nil {
		return nil, err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(d.b))
	}
	m.recs = recs
	return m, nil
}

// syncs reads the digests of a kindSync message of version v.
func (d *decoder) syncs(v byte) []syncEntry {
	out := make([]syncEntry, d.count(3))
	for i := range out {
		e := &out[i]
		e.nid = d.str()
		e.level = d.byte()
		switch e.level {
		case syncNetwork:
			e.sum = d.digest()
		case syncCompare, syncFinal:
			e.groups = make([]ownerDigest, d.count(10))
			for j := range e.groups {
				e.groups[j] = ownerDigest{owner: d.str(), d: d.digest()}
				if v >= wireSyncMarks {
					e.groups[j].hw = Version{Epoch: d.uvarint(), Seq: d.uvarint()}
				}
			}
		default:
			d.fail(fmt.Errorf("unknown sync level %d", e.level))
		}
		if d.err != nil {
			return nil
		}
		if e.nid == "" {
			d.fail(errors.New("sync entry without a network"))
		}
	}
	return out
}

func (d *decoder) digest() digest {
	n := d.uvarint()
	if len(d.b) < 8 {
		d.fail(errTruncated)
		return digest{}
	}
	h := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return digest{count: n, hash: h}
}

func (e *encoder) digest(g digest) {
	e.uvarint(g.count)
	e.b = binary.BigEndian.AppendUint64(e.b, g.hash)
}

// encodeRestart encodes a kindRestart message at version v (3 or more):
// node's instance epoch is stopping on purpose and will be back.
func encodeRestart(v byte, node string, epoch uint64) []byte {
	e := encoder{b: make([]byte, 0, 16+len(node))}
	e.b = append(e.b, wireMagic, v, kindRestart)
	e.str(node)
	e.uvarint(epoch)
	return e.b
}

// encodeSettings encodes a kindSettings message at version v (3 or more).
func encodeSettings(v byte, node string, epoch uint64, adv Settings, keyIDs []string) []byte {
	e := encoder{b: make([]byte, 0, 24+len(node)+5*len(keyIDs))}
	e.b = append(e.b, wireMagic, v, kindSettings)
	e.str(node)
	e.uvarint(epoch)
	e.uvarint(uint64(adv.VXLANPort))
	e.uvarint(uint64(adv.UnderlayMTU))
	swarm := uint64(0)
	if adv.Swarm {
		swarm = 1
	}
	e.uvarint(swarm)
	e.uvarint(uint64(len(keyIDs)))
	for _, id := range keyIDs {
		e.str(id)
	}
	return e.b
}

// encodeSync encodes a kindSync message at version v: digests, then
// records (grouped by network).
func encodeSync(v byte, from string, syncs []syncEntry, recs []*record, now time.Time) []byte {
	e := encoder{b: make([]byte, 0, 64+64*len(recs))}
	e.b = append(e.b, wireMagic, v, kindSync)
	e.str(from)
	e.uvarint(uint64(len(syncs)))
	for _, s := range syncs {
		e.str(s.nid)
		e.b = append(e.b, s.level)
		if s.level == syncNetwork {
			e.digest(s.sum)
			continue
		}
		e.uvarint(uint64(len(s.groups)))
		for _, g := range s.groups {
			e.str(g.owner)
			e.digest(g.d)
			if v >= wireSyncMarks {
				e.uvarint(g.hw.Epoch)
				e.uvarint(g.hw.Seq)
			}
		}
	}
	e.records(recs, now)
	return e.b
}

// records reads a records section.
func (d *decoder) records(now time.Time) ([]*record, error) {
	var recs []*record
	owners := make([]string, d.count(1))
	for i := range owners {
		owners[i] = d.str()
	}
	nNets := d.count(2)
	for range nNets {
		nid := d.str()
		nRecs := d.count(4)
		for range nRecs {
			r := &record{NetworkID: nid}
			flags := d.byte()
			if flags&^(flagDeleted|flagMember) != 0 {
				d.fail(fmt.Errorf("unknown record flags %#x", flags))
			}
			r.Deleted = flags&flagDeleted != 0
			r.Member = flags&flagMember != 0
			if !r.Member {
				r.EndpointID = d.str()
			}
			oi := d.uvarint()
			if d.err == nil && oi >= uint64(len(owners)) {
				d.fail(fmt.Errorf("owner index %d out of range", oi))
			}
			r.Version.Epoch = d.uvarint()
			r.Version.Seq = d.uvarint()
			switch {
			case r.Deleted:
				ms := d.uvarint()
				// Clamp absurd ages (they only make the tombstone expired).
				if ms > math.MaxInt64/uint64(time.Millisecond) {
					ms = math.MaxInt64 / uint64(time.Millisecond)
				}
				r.At = instantOf(now.Add(-time.Duration(ms) * time.Millisecond))
			case !r.Member:
				if len(d.b) < 6 {
					d.fail(errTruncated)
				} else {
					r.MAC = hwaddr.MAC(d.b[:6])
					d.b = d.b[6:]
				}
				r.VTEP = unique.Make(d.addr())
				n := d.count(1)
				if n > maxIPs {
					d.fail(fmt.Errorf("%d IPs in one record", n))
				}
				r.IPs = make([]netip.Addr, 0, n)
				for range n {
					r.IPs = append(r.IPs, d.addr())
				}
			}
			if d.err != nil {
				return nil, d.err
			}
			r.Owner = owners[oi]
			if r.Member {
				r.EndpointID = memberEID(r.Owner)
			}
			if r.Version.Epoch == 0 || r.Version.Epoch >= maxWireEpoch {
				return nil, fmt.Errorf("record %s: epoch %d out of range", r.EndpointID, r.Version.Epoch)
			}
			if err := r.validate(); err != nil {
				return nil, err
			}
			recs = append(recs, r)
		}
	}
	return recs, d.err
}
