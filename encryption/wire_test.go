package encryption

import (
	"bytes"
	"testing"
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
		if got[i].Gen != keys[i].Gen || !bytes.Equal(got[i].Key, keys[i].Key) || !got[i].ActivateAt.Equal(keys[i].ActivateAt) {
			t.Fatalf("key %d: %+v, want %+v", i, got[i], keys[i])
		}
	}
}

func FuzzDecodePublicKeys(f *testing.F) {
	f.Add([]byte{1})
	f.Add(append([]byte{1}, make([]byte, wireKeyLen)...))
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
