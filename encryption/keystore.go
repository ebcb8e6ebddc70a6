package encryption

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"

	"go.etcd.io/bbolt"
)

// The public keys this node last published, and the address it published
// them for, live in the state database, so that the next run on this host
// can take over the IPsec state they made (Config.Resume) and keep
// encrypted sandboxes across a restart. Public keys only: the private ones
// go with the process that made them.

var (
	keysBucket = []byte("encryption")
	keysKey    = []byte("published")
)

type publishedKeys struct {
	VTEP netip.Addr `json:"vtep"`
	Keys []byte     `json:"keys"` // EncodePublicKeys
}

// KeyStore keeps the published public keys in the state database.
type KeyStore struct{ DB *bbolt.DB }

// Save records keys as this node's, published for vtep.
func (s KeyStore) Save(vtep netip.Addr, keys []PublicKey) error {
	enc, err := EncodePublicKeys(keys)
	if err != nil {
		return err
	}
	v, err := json.Marshal(publishedKeys{VTEP: vtep, Keys: enc})
	if err != nil {
		return err
	}
	return s.DB.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(keysBucket)
		if err != nil {
			return err
		}
		return b.Put(keysKey, v)
	})
}

// load returns what Save stored last; no keys if nothing was.
func (s KeyStore) load() (netip.Addr, []PublicKey, error) {
	var rec publishedKeys
	err := s.DB.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(keysBucket)
		if b == nil {
			return nil
		}
		v := b.Get(keysKey)
		if v == nil {
			return nil
		}
		return json.Unmarshal(v, &rec)
	})
	if err != nil || rec.Keys == nil {
		return netip.Addr{}, nil, err
	}
	keys, err := DecodePublicKeys(rec.Keys)
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("stored public keys: %w", err)
	}
	return rec.VTEP, keys, nil
}

// Resume returns the public keys the previous run published, if it
// published them for addr: its IPsec state is then this run's to take
// over (Config.Resume). Otherwise that state is removed.
func (s KeyStore) Resume(addr netip.Addr, log *slog.Logger) []PublicKey {
	vtep, keys, err := s.load()
	switch {
	case err != nil:
		log.Warn("stored public keys unreadable", "why", "the previous run's IPsec state cannot be taken over", "err", err)
		return nil
	case keys != nil && vtep != addr:
		log.Warn("host address changed", "why", "this host's address changed since the previous run; its IPsec state cannot be taken over", "was", vtep, "now", addr)
		return nil
	}
	return keys
}
