package encryption

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/cluster"
)

func TestPublicKeysRoundTrip(t *testing.T) {
	k, err := NewKeyring(testSchedule(), t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.ForceRotate(t0.Add(1)); err != nil {
		t.Fatal(err)
	}
	keys := k.Public()
	keys[0].Inherited = true
	b, err := EncodePublicKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodePublicKeys(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("%d keys back, want %d", len(got), len(keys))
	}
	for i := range keys {
		if got[i].Gen != keys[i].Gen || !bytes.Equal(got[i].Key, keys[i].Key) || !got[i].ActivateAt.Equal(keys[i].ActivateAt) || got[i].Inherited != keys[i].Inherited {
			t.Fatalf("key %d: %+v, want %+v", i, got[i], keys[i])
		}
	}
}

// TestPublicKeysVersion1: the previous format, without flags, as the
// previous release publishes and stored its keys, still reads.
func TestPublicKeysVersion1(t *testing.T) {
	b := []byte{wireV1}
	b = binary.BigEndian.AppendUint64(b, 42)
	b = append(b, bytes.Repeat([]byte{7}, 32)...)
	b = binary.BigEndian.AppendUint64(b, uint64(t0.UnixNano()))
	got, err := DecodePublicKeys(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Gen != 42 || !bytes.Equal(got[0].Key, bytes.Repeat([]byte{7}, 32)) || !got[0].ActivateAt.Equal(t0) || got[0].Inherited {
		t.Fatalf("version 1 keys read as %+v", got)
	}
	if _, err := DecodePublicKeys(b[:len(b)-1]); err == nil {
		t.Fatal("a truncated version 1 record was accepted")
	}
}

func FuzzDecodePublicKeys(f *testing.F) {
	f.Add([]byte{wireV1})
	f.Add(append([]byte{wireV1}, make([]byte, wireV1KeyLen)...))
	f.Add(append([]byte{wireVersion}, make([]byte, wireKeyLen)...))
	f.Add([]byte{2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := DecodePublicKeys(b)
		if err == nil {
			if _, err := EncodePublicKeys(keys); err != nil {
				t.Fatalf("decoded keys do not encode: %v", err)
			}
		}
	})
}

// TestPublishedKeysFitNodeMeta: the most generations ever published fit
// the gossip node meta.
func TestPublishedKeysFitNodeMeta(t *testing.T) {
	keys := make([]PublicKey, MaxPublished)
	for i := range keys {
		keys[i] = PublicKey{Gen: uint64(i), Key: make([]byte, 32), ActivateAt: t0, Inherited: true}
	}
	b, err := EncodePublicKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > cluster.MaxNodeData {
		t.Fatalf("%d generations take %d bytes, the node meta holds %d", MaxPublished, len(b), cluster.MaxNodeData)
	}
}
