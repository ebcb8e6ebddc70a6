package main

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// The public keys this node last published, and the address it published
// them for, live in the state database, so that the next run on this host
// can take over the IPsec state they made (encryption.Config.Resume) and
// keep encrypted sandboxes across a restart. Public keys only: the private
// ones go with the process that made them.

var (
	keysBucket = []byte("encryption")
	keysKey    = []byte("published")
)

type publishedKeys struct {
	VTEP netip.Addr `json:"vtep"`
	Keys []byte     `json:"keys"` // encryption.EncodePublicKeys
}

func saveKeys(db *bbolt.DB, vtep netip.Addr, keys []byte) error {
	v, err := json.Marshal(publishedKeys{VTEP: vtep, Keys: keys})
	if err != nil {
		return err
	}
	return db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(keysBucket)
		if err != nil {
			return err
		}
		return b.Put(keysKey, v)
	})
}

// loadKeys returns what saveKeys stored last; no keys if nothing was.
func loadKeys(db *bbolt.DB) (netip.Addr, []encryption.PublicKey, error) {
	var rec publishedKeys
	err := db.View(func(tx *bbolt.Tx) error {
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
	keys, err := encryption.DecodePublicKeys(rec.Keys)
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("stored public keys: %w", err)
	}
	return rec.VTEP, keys, nil
}
