package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
)

// keyring holds the gossip keys, during a rotation more than one: the
// first (the primary) seals what this node sends, any of them opens what
// it receives, as memberlist's Keyring does for memberlist's own
// messages. The screen and the channels read it for every message, so
// the keys are replaced whole (set) and read without a lock. Whether the
// cluster is encrypted at all is fixed when it is made.
type keyring struct {
	encrypted bool
	keys      atomic.Pointer[[][]byte]
}

// newKeyring returns a keyring with primary first, then accept; a nil
// primary is a plaintext cluster.
func newKeyring(primary []byte, accept ...[]byte) *keyring {
	k := &keyring{encrypted: primary != nil}
	if k.encrypted {
		k.set(append([][]byte{primary}, accept...))
	}
	return k
}

// checkKeys says whether keys may be a keyring: one at least, each 32
// bytes (AES-256, as every gossip key derived from a secret is).
func checkKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("no gossip key")
	}
	for i, k := range keys {
		if len(k) != 32 {
			return fmt.Errorf("gossip key %d is %d bytes, want 32", i+1, len(k))
		}
	}
	return nil
}

func (k *keyring) set(keys [][]byte) {
	own := make([][]byte, len(keys))
	for i, key := range keys {
		own[i] = append([]byte(nil), key...)
	}
	k.keys.Store(&own)
}

// primary is the key to send with; nil in a plaintext cluster.
func (k *keyring) primary() []byte {
	if !k.encrypted {
		return nil
	}
	return (*k.keys.Load())[0]
}

// open decrypts msg (memberlist's encrypted payload) with the first key
// that opens it.
func (k *keyring) open(msg, aad []byte) ([]byte, error) {
	var err error
	for _, key := range *k.keys.Load() {
		var plain []byte
		if plain, err = openPayload(key, msg, aad); err == nil {
			return plain, nil
		}
	}
	return nil, err
}

// maxKeyIDs bounds the key ids a node advertises, as the keyring file
// bounds the secrets (encryption.MaxSecrets).
const maxKeyIDs = 8

// checkKeyIDs validates key ids, this node's or a member's: at most
// maxKeyIDs, each 8 lowercase hex digits (encryption.SecretID), none
// twice.
func checkKeyIDs(ids []string) error {
	if len(ids) > maxKeyIDs {
		return fmt.Errorf("%d key ids, at most %d", len(ids), maxKeyIDs)
	}
	for i, id := range ids {
		if len(id) != 8 || strings.Trim(id, "0123456789abcdef") != "" {
			return fmt.Errorf("key id %q is not 8 lowercase hex digits", id)
		}
		if slices.Contains(ids[:i], id) {
			return fmt.Errorf("key id %s twice", id)
		}
	}
	return nil
}

// keyIDs decodes a settings message's key ids.
func (d *decoder) keyIDs() []string {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > maxKeyIDs {
		d.fail(fmt.Errorf("%d key ids, at most %d", n, maxKeyIDs))
		return nil
	}
	ids := make([]string, 0, n)
	for range n {
		ids = append(ids, d.str())
	}
	if d.err == nil {
		if err := checkKeyIDs(ids); err != nil {
			d.fail(err)
		}
	}
	return ids
}

// SetKeys replaces the gossip keys, as a changed keyring file asks:
// primary seals what this node sends from now on, primary and accept open
// what it receives, and ids (the secrets' ids, primary first) are told to
// every member. Bad keys or ids change nothing. A cluster started without
// a key gets none: its plaintext members would be cut off. Calls must not
// overlap (the control plane makes them from one goroutine).
func (c *Cluster) SetKeys(primary []byte, accept [][]byte, ids []string) error {
	if !c.keys.encrypted {
		return errors.New("cluster: gossip is plaintext: a key needs --secret-file at start")
	}
	all := append([][]byte{primary}, accept...)
	if err := checkKeys(all); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := checkKeyIDs(ids); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	// memberlist's own messages first: it accepts the new keys before
	// any member may send with them, and drops the old ones last.
	ring := c.mlKeyring
	for _, k := range all {
		if err := ring.AddKey(k); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if err := ring.UseKey(primary); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	for _, k := range ring.GetKeys() {
		if !slices.ContainsFunc(all, func(a []byte) bool { return bytes.Equal(a, k) }) {
			if err := ring.RemoveKey(k); err != nil {
				return fmt.Errorf("cluster: %w", err)
			}
		}
	}
	c.keys.set(all)
	c.mu.Lock()
	c.keyIDs = slices.Clone(ids)
	for name, m := range c.st.members {
		if m.alive {
			c.settingsDueLocked(name)
		}
	}
	c.mu.Unlock()
	return nil
}
