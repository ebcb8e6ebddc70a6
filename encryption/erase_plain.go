//go:build !goexperiment.runtimesecret

package encryption

// ErasesTemporaries reports whether this build erases what key computations
// leave in registers, on the stack and on the heap: not without
// GOEXPERIMENT=runtimesecret.
const ErasesTemporaries = false

func inSecret(f func()) { f() }
