package encryption

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Public keys travel in the gossip node meta, which memberlist caps at 512
// bytes: version(1), then per generation gen(8) key(32) activateAt(8,
// unix ns) flags(1), all big endian. Version 1, without flags, is still
// read: the previous release's nodes, and the keys it stored for a resume.
const (
	wireVersion   = 2
	wireV1        = 1
	wireV1KeyLen  = 8 + 32 + 8
	wireKeyLen    = wireV1KeyLen + 1
	flagInherited = 1 << 0
	// MaxPublished is how many generations fit, far more than a schedule
	// ever keeps live (two, three around a forced rotation).
	MaxPublished = 8
)

// EncodePublicKeys serialises keys for the node meta.
func EncodePublicKeys(keys []PublicKey) ([]byte, error) {
	if len(keys) > MaxPublished {
		return nil, fmt.Errorf("%d public keys to publish, at most %d fit", len(keys), MaxPublished)
	}
	b := make([]byte, 1, 1+len(keys)*wireKeyLen)
	b[0] = wireVersion
	for _, k := range keys {
		if len(k.Key) != 32 {
			return nil, errors.New("public key is not 32 bytes")
		}
		b = binary.BigEndian.AppendUint64(b, k.Gen)
		b = append(b, k.Key...)
		b = binary.BigEndian.AppendUint64(b, uint64(k.ActivateAt.UnixNano()))
		var flags byte
		if k.Inherited {
			flags |= flagInherited
		}
		b = append(b, flags)
	}
	return b, nil
}

// DecodePublicKeys parses what EncodePublicKeys made; anything else from
// the network is an error, never a panic.
func DecodePublicKeys(b []byte) ([]PublicKey, error) {
	if len(b) < 1 || (b[0] != wireVersion && b[0] != wireV1) {
		return nil, errors.New("public keys: unknown format")
	}
	size := wireKeyLen
	if b[0] == wireV1 {
		size = wireV1KeyLen
	}
	b = b[1:]
	if len(b)%size != 0 || len(b)/size > MaxPublished {
		return nil, fmt.Errorf("public keys: bad length %d", len(b))
	}
	out := make([]PublicKey, 0, len(b)/size)
	for ; len(b) > 0; b = b[size:] {
		k := PublicKey{
			Gen:        binary.BigEndian.Uint64(b),
			Key:        append([]byte(nil), b[8:40]...),
			ActivateAt: time.Unix(0, int64(binary.BigEndian.Uint64(b[40:48]))),
		}
		if size == wireKeyLen {
			k.Inherited = b[48]&flagInherited != 0
		}
		out = append(out, k)
	}
	return out, nil
}
