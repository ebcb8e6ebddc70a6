package cluster

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// Wire format (all integers are unsigned varints unless stated):
//
//	message  = magic(1 byte 0xC7) version(1 byte) kind(1 byte) body
//	body     = nOwners owner{nOwners} nNets net{nNets}
//	net      = string(networkID) nRecs rec{nRecs}
//	rec      = flags(1 byte; bit0 deleted) string(endpointID) ownerIndex epoch seq
//	           ( ageMillis                                   if deleted
//	           | mac(6 bytes) addr(vtep) nIPs addr{nIPs}     otherwise )
//	string   = uvarint(len<<1 | packed) bytes   // packed: even-length lowercase
//	                                            // hex stored as len raw bytes
//	addr     = 1 byte length (4 or 16) + bytes
//
// Gossip messages (kindRecords) carry one record; push/pull (kindState) the
// whole table, grouped by network with the owner names interned. Docker's
// 64-hex ids pack to 33 bytes, so a live single-record gossip message is
// about 110 bytes and a state costs about 55 bytes per record (before
// memberlist's own compression). Decoding never panics: every length is
// bounded by the bytes remaining and the limits of validate.
const (
	wireMagic   = 0xC7
	wireVersion = 1

	kindRecords = 1
	kindState   = 2
)

var errTruncated = errors.New("truncated message")

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

// encodeRecords encodes recs as one message of the given kind. recs must
// be grouped by network (consecutive records of a network); ages of
// tombstones are computed against now.
func encodeRecords(kind byte, recs []*record, now time.Time) []byte {
	e := encoder{b: make([]byte, 0, 64+64*len(recs))}
	e.b = append(e.b, wireMagic, wireVersion, kind)
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
			encodeRecord(&e, r, owners[r.Owner], now)
		}
		i = j
	}
	return e.b
}

func encodeRecord(e *encoder, r *record, owner uint64, now time.Time) {
	var flags byte
	if r.Deleted {
		flags |= 1
	}
	e.b = append(e.b, flags)
	e.str(r.EndpointID)
	e.uvarint(owner)
	e.uvarint(r.Version.Epoch)
	e.uvarint(r.Version.Seq)
	if r.Deleted {
		age := max(now.Sub(r.DeletedAt), 0)
		e.uvarint(uint64(age / time.Millisecond))
		return
	}
	e.b = append(e.b, r.MAC[:]...)
	e.addr(r.VTEP)
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

// decodeMessage decodes a message from the network. Each record is checked
// with validate; the first problem fails the whole message (a peer that
// sends garbage gets none of its message applied). Tombstone ages are
// turned into DeletedAt on now's clock.
func decodeMessage(buf []byte, now time.Time) (kind byte, recs []*record, err error) {
	d := decoder{b: buf}
	if d.byte() != wireMagic || d.err != nil {
		return 0, nil, errors.New("bad magic")
	}
	if v := d.byte(); v != wireVersion {
		return 0, nil, fmt.Errorf("unsupported wire version %d", v)
	}
	kind = d.byte()
	if kind != kindRecords && kind != kindState {
		return 0, nil, fmt.Errorf("unknown message kind %d", kind)
	}
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
			if flags&^1 != 0 {
				d.fail(fmt.Errorf("unknown record flags %#x", flags))
			}
			r.Deleted = flags&1 == 1
			r.EndpointID = d.str()
			oi := d.uvarint()
			if d.err == nil && oi >= uint64(len(owners)) {
				d.fail(fmt.Errorf("owner index %d out of range", oi))
			}
			r.Version.Epoch = d.uvarint()
			r.Version.Seq = d.uvarint()
			if r.Deleted {
				ms := d.uvarint()
				// Clamp absurd ages (they only make the tombstone expired).
				if ms > math.MaxInt64/uint64(time.Millisecond) {
					ms = math.MaxInt64 / uint64(time.Millisecond)
				}
				r.DeletedAt = now.Add(-time.Duration(ms) * time.Millisecond)
			} else {
				if len(d.b) < 6 {
					d.fail(errTruncated)
				} else {
					r.MAC = hwaddr.MAC(d.b[:6])
					d.b = d.b[6:]
				}
				r.VTEP = d.addr()
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
				return kind, nil, d.err
			}
			r.Owner = owners[oi]
			if r.Version.Epoch == 0 || r.Version.Epoch >= maxWireEpoch {
				return kind, nil, fmt.Errorf("record %s: epoch %d out of range", r.EndpointID, r.Version.Epoch)
			}
			if err := r.validate(); err != nil {
				return kind, nil, err
			}
			recs = append(recs, r)
		}
	}
	if d.err != nil {
		return kind, nil, d.err
	}
	if len(d.b) != 0 {
		return kind, nil, fmt.Errorf("%d trailing bytes", len(d.b))
	}
	return kind, recs, nil
}
