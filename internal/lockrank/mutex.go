//go:build !lockrank

package lockrank

import "sync"

// Mutex is a sync.Mutex of class C. This build does not check the order.
type Mutex[C Class] struct{ sync.Mutex }

// Checking reports whether this build checks the lock order.
const Checking = false
