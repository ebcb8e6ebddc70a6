package encryption

import (
	"crypto/ecdh"
	"crypto/rand"
)

// Forward secrecy needs a retired private key gone from memory, not just
// unreferenced: Go's collector does not clear what it frees. So the raw
// X25519 scalar lives in one heap slice, owned by its generation and
// cleared when the generation retires, and every computation on it runs in
// inSecret. Built with GOEXPERIMENT=runtimesecret (the Makefile and
// plugin/build.sh set it), that is runtime/secret.Do: the runtime then
// erases the registers and stack the X25519 code used, and the heap copies
// crypto/ecdh makes once they are garbage, and it never preempts the
// computation by signal. Without it, such a preemption spills every
// register, key included, onto the goroutine stack, where the copy outlives
// the call (TestRetiredKeyLeavesNoCopyInMemory caught one run in twenty).

// newKey draws a private scalar and computes its public key.
func newKey() (priv, pub []byte, err error) {
	inSecret(func() {
		priv = make([]byte, 32)
		rand.Read(priv) // crashes the program rather than return an error
		var k *ecdh.PrivateKey
		if k, err = ecdh.X25519().NewPrivateKey(priv); err == nil {
			pub = k.PublicKey().Bytes()
		}
	})
	return priv, pub, err
}

// sharedSecret is X25519(priv, peer).
func sharedSecret(priv []byte, peer *ecdh.PublicKey) (shared []byte, err error) {
	inSecret(func() {
		var k *ecdh.PrivateKey
		if k, err = ecdh.X25519().NewPrivateKey(priv); err == nil {
			shared, err = k.ECDH(peer)
		}
	})
	return shared, err
}
