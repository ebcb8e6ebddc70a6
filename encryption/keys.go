// Package encryption keeps the IPsec state of encrypted overlay networks:
// this node's X25519 key generations, the public keys other nodes publish,
// the ESP keys and SPIs derived for every ordered pair of hosts, and the
// xfrm states and policies that carry them.
//
// Every pair of hosts has its own keys, one per direction: the key of
// src→dst is HKDF-SHA256 over the X25519 shared secret of src's and dst's
// current generations, salted with the cluster secret and bound to both
// addresses, both generations and the direction. A stolen cluster secret
// alone yields no ESP key, and a retired generation's private key is wiped,
// so recorded traffic stays sealed (forward secrecy per generation).
package encryption

import (
	"bytes"
	"cmp"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// ESP parameters: rfc4106(gcm(aes)) takes a 256-bit key followed by a
// 4-byte salt; the ICV is 16 bytes.
const (
	AEADName  = "rfc4106(gcm(aes))"
	KeyLen    = 32 + 4
	ICVBits   = 128
	SecretLen = 32
)

// PublicKey is one generation of a node's key, as published by gossip.
type PublicKey struct {
	// Gen numbers a node's generations; larger is newer. It is the
	// generation's creation time in nanoseconds, so it grows across restarts.
	Gen uint64 `json:"gen"`
	// Key is the X25519 public key.
	Key []byte `json:"key"`
	// ActivateAt is when senders start using this generation. Receivers
	// install inbound SAs for it as soon as they learn it, which the lead
	// between publishing and activation leaves time for.
	ActivateAt time.Time `json:"activateAt"`
	// Inherited marks a generation of its owner's previous run: the owner
	// receives on the SAs that run installed but derives no new ones for
	// it, so a sender keeps the SA it uses with it (see Manager.reconcile).
	Inherited bool `json:"inherited,omitempty"`
}

// Direction names one ESP security association: traffic from Src to Dst,
// keyed by Src's generation SrcGen and Dst's generation DstGen, and salted
// with the cluster secret of id Secret (PairSecret). The id is not part of
// the derivation's input, only the secret is: with one secret, the keys
// are those of a release before keyrings.
type Direction struct {
	Src, Dst       netip.Addr
	SrcGen, DstGen uint64
	Secret         string
}

func (d Direction) String() string {
	return fmt.Sprintf("%s(g%d)->%s(g%d) secret %s", d.Src, d.SrcGen, d.Dst, d.DstGen, d.Secret)
}

// SA is the key material of one direction.
type SA struct {
	Direction
	SPI uint32
	Key []byte // KeyLen bytes: AES-256 key then salt
}

// DeriveSA computes the key and SPI of d from the X25519 shared secret of
// the two generations. Both ends compute the same result: the sender from
// its private key and the receiver's public key, the receiver the other way
// round.
func DeriveSA(shared, clusterSecret []byte, d Direction) (SA, error) {
	if len(clusterSecret) != SecretLen {
		return SA{}, fmt.Errorf("cluster secret is %d bytes, want %d", len(clusterSecret), SecretLen)
	}
	if len(shared) != 32 {
		return SA{}, errors.New("shared secret is not 32 bytes")
	}
	info := make([]byte, 0, 96)
	info = append(info, "overlay-plugin esp v1 "...)
	info = append(info, d.Src.AsSlice()...)
	info = append(info, d.Dst.AsSlice()...)
	info = binary.BigEndian.AppendUint64(info, d.SrcGen)
	info = binary.BigEndian.AppendUint64(info, d.DstGen)
	info = append(info, " src->dst"...)
	okm, err := hkdf.Key(sha256.New, shared, clusterSecret, string(info), KeyLen+4)
	if err != nil {
		return SA{}, err
	}
	spi := binary.BigEndian.Uint32(okm[KeyLen:])
	if spi < 256 { // 1-255 are reserved by IANA, 0 means none
		spi += 256
	}
	return SA{Direction: d, SPI: spi, Key: okm[:KeyLen]}, nil
}

// Schedule says when generations are made, used and dropped.
type Schedule struct {
	// Interval between generations.
	Interval time.Duration
	// Lead is how long a new generation is published before senders use
	// it. It must exceed gossip propagation plus the clock skew between
	// hosts.
	Lead time.Duration
	// Grace is how long a superseded generation still receives after its
	// successor activated. It must exceed the clock skew between hosts.
	Grace time.Duration
}

// DefaultSchedule rotates hourly.
var DefaultSchedule = Schedule{Interval: time.Hour, Lead: time.Minute, Grace: 2 * time.Minute}

// ScheduleEvery is the schedule of a rotation interval: new keys are
// published a tenth of the interval (at most a minute) ahead, and old ones
// kept a fifth (at most two minutes) after.
func ScheduleEvery(interval time.Duration) Schedule {
	return Schedule{Interval: interval, Lead: min(time.Minute, interval/10), Grace: min(2*time.Minute, interval/5)}
}

// Validate reports a schedule that could lose packets.
func (s Schedule) Validate() error {
	if s.Interval <= 0 || s.Lead <= 0 || s.Grace <= 0 {
		return errors.New("key schedule: interval, lead and grace must be positive")
	}
	if s.Lead+s.Grace >= s.Interval {
		return fmt.Errorf("key schedule: lead %v plus grace %v must be shorter than the interval %v", s.Lead, s.Grace, s.Interval)
	}
	return nil
}

// generation is one of this node's key pairs.
type generation struct {
	pub PublicKey
	// priv is the raw X25519 scalar, used only in inSecret; nil once
	// wiped, and for a generation inherited from the previous run, whose
	// private key went with that process (its SAs stay in the kernel).
	priv []byte
}

// errNoPrivateKey: the generation is inherited; the kernel holds what its
// private key made, nothing more can be derived from it.
var errNoPrivateKey = errors.New("generation inherited from the previous run: no private key")

// Keyring is this node's generations, oldest first. Not safe for concurrent
// use: the Manager's mutex guards it.
type Keyring struct {
	sched Schedule
	gens  []*generation
}

// NewKeyring makes the first generation, active at once: at start there is
// no traffic to protect yet.
func NewKeyring(s Schedule, now time.Time) (*Keyring, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	k := &Keyring{sched: s}
	if err := k.add(now, now); err != nil {
		return nil, err
	}
	return k, nil
}

// ResumeKeyring continues the previous run's public generations, whose
// SAs the kernel still holds, and makes none of its own yet: peers reach a
// restarted node only when they re-join it, so a generation made now could
// activate before any of them heard of it, and the first packets sent with
// it would meet no inbound SA. The Manager starts this run's generation
// when the first peer's keys arrive, the moment peers get ours, so it
// activates Lead later as in any rotation; until then senders keep using
// the inherited ones, which retire on the usual schedule. Should no peer
// come, Tick starts one when the schedule says one is due.
func ResumeKeyring(s Schedule, inherited []PublicKey) (*Keyring, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if len(inherited) == 0 {
		return nil, errors.New("key ring: nothing to resume")
	}
	k := &Keyring{sched: s}
	for _, pk := range slices.SortedFunc(slices.Values(inherited), func(a, b PublicKey) int { return cmp.Compare(a.Gen, b.Gen) }) {
		if len(pk.Key) != 32 {
			return nil, fmt.Errorf("key ring: inherited generation %d has a %d-byte key", pk.Gen, len(pk.Key))
		}
		pk.Key = bytes.Clone(pk.Key)
		k.gens = append(k.gens, &generation{pub: pk})
	}
	return k, nil
}

// Resuming reports whether every generation is inherited: this run has
// made none of its own yet.
func (k *Keyring) Resuming() bool {
	return !slices.ContainsFunc(k.gens, func(g *generation) bool { return g.priv != nil })
}

// Inherited reports whether a generation of the previous run is still
// live.
func (k *Keyring) Inherited() bool {
	return slices.ContainsFunc(k.gens, func(g *generation) bool { return g.priv == nil })
}

func (k *Keyring) add(now, activate time.Time) error {
	priv, pub, err := newKey()
	if err != nil {
		return fmt.Errorf("generate X25519 key: %w", err)
	}
	gen := uint64(now.UnixNano())
	if n := len(k.gens); n > 0 && gen <= k.gens[n-1].pub.Gen {
		gen = k.gens[n-1].pub.Gen + 1 // a clock that stepped back
	}
	k.gens = append(k.gens, &generation{
		pub:  PublicKey{Gen: gen, Key: pub, ActivateAt: activate},
		priv: priv,
	})
	return nil
}

// Tick advances the schedule to now: it creates the next generation Lead
// before it is due and wipes generations whose successor has been active
// for Grace. It reports whether anything changed (publish and reprogram).
func (k *Keyring) Tick(now time.Time) (bool, error) {
	changed := false
	newest := k.gens[len(k.gens)-1].pub
	if due := newest.ActivateAt.Add(k.sched.Interval); !now.Before(due.Add(-k.sched.Lead)) {
		if err := k.add(now, maxTime(due, now.Add(k.sched.Lead))); err != nil {
			return false, err
		}
		changed = true
	}
	for len(k.gens) > 1 && !now.Before(k.gens[1].pub.ActivateAt.Add(k.sched.Grace)) {
		clear(k.gens[0].priv)
		k.gens[0].priv = nil
		k.gens = k.gens[1:]
		changed = true
	}
	return changed, nil
}

// ForceRotate publishes a new generation that activates after Lead,
// whatever the schedule says (an operator's or a test's request).
func (k *Keyring) ForceRotate(now time.Time) error {
	return k.add(now, now.Add(k.sched.Lead))
}

// Public returns copies of the live generations' public keys.
func (k *Keyring) Public() []PublicKey {
	out := make([]PublicKey, len(k.gens))
	for i, g := range k.gens {
		out[i] = g.pub
		out[i].Key = append([]byte(nil), g.pub.Key...)
		out[i].Inherited = g.priv == nil
	}
	return out
}

// Active is the generation a sender uses at now: the newest activated one,
// or, when the sender's clock is behind every activation time, the oldest
// (which the receiver still holds).
func Active(keys []PublicKey, now time.Time) (PublicKey, bool) {
	var best, oldest PublicKey
	found := false
	for i, k := range keys {
		if i == 0 || k.Gen < oldest.Gen {
			oldest = k
		}
		if !k.ActivateAt.After(now) && (!found || k.Gen > best.Gen) {
			best, found = k, true
		}
	}
	if !found && len(keys) > 0 {
		return oldest, true
	}
	return best, found
}

// Shared computes the X25519 shared secret of our generation gen with a
// peer's public key.
func (k *Keyring) Shared(gen uint64, peer []byte) ([]byte, error) {
	for _, g := range k.gens {
		if g.pub.Gen != gen {
			continue
		}
		if g.priv == nil {
			return nil, errNoPrivateKey
		}
		pub, err := ecdh.X25519().NewPublicKey(peer)
		if err != nil {
			return nil, fmt.Errorf("peer public key: %w", err)
		}
		return sharedSecret(g.priv, pub)
	}
	return nil, fmt.Errorf("no generation %d", gen)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
