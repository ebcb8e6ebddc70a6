package encryption

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"reflect"
	"unsafe"
)

// Forward secrecy needs a retired private key to be gone from memory, not
// just unreferenced: Go's collector does not clear what it frees. So the
// key's bytes exist in exactly one place, inside its ecdh.PrivateKey, and
// wipe zeroes them there. The X25519 code copies the scalar only to the
// stack, clamped; keys are drawn unclamped so those copies never equal the
// key. TestRetiredKeyLeavesNoCopyInMemory scans the process for the key
// and fails if a Go release changes any of this.

// newPrivateKey draws a key whose raw bytes differ from their clamped form.
func newPrivateKey() (*ecdh.PrivateKey, error) {
	var raw [32]byte
	defer clear(raw[:])
	for {
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, fmt.Errorf("generate X25519 key: %w", err)
		}
		if raw[0]&7 != 0 && raw[31]&0xC0 != 0x40 {
			break
		}
	}
	return ecdh.X25519().NewPrivateKey(raw[:])
}

// wipe zeroes the private scalar held inside k. It fails closed: if the
// standard library's layout ever changes, it panics at the first rotation
// (and the test catches it) rather than silently keeping keys.
func wipe(k *ecdh.PrivateKey) {
	if k == nil {
		return
	}
	f := reflect.ValueOf(k).Elem().FieldByName("privateKey")
	if !f.IsValid() || f.Kind() != reflect.Slice || f.Type().Elem().Kind() != reflect.Uint8 {
		panic("encryption: crypto/ecdh.PrivateKey has no privateKey []byte field to wipe")
	}
	clear(unsafe.Slice((*byte)(f.UnsafePointer()), f.Len()))
}
