//go:build goexperiment.runtimesecret

package encryption

import rtsecret "runtime/secret"

// ErasesTemporaries reports whether this build erases what key computations
// leave in registers, on the stack and on the heap.
const ErasesTemporaries = true

func inSecret(f func()) { rtsecret.Do(f) }
