//go:build lockrank

package lockrank

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
)

// Mutex is a sync.Mutex of class C whose every Lock is checked against the
// order; a violation panics with both locks named.
type Mutex[C Class] struct {
	mu    sync.Mutex
	owner int64 // the goroutine that holds it
}

// Checking reports whether this build checks the lock order.
const Checking = true

var state held

func (m *Mutex[C]) Lock() {
	var c C
	g := goid()
	if err := state.acquire(g, c.Rank()); err != nil {
		panic(err)
	}
	m.mu.Lock()
	m.owner = g
}

func (m *Mutex[C]) TryLock() bool {
	var c C
	g := goid()
	if err := state.acquire(g, c.Rank()); err != nil {
		panic(err)
	}
	if !m.mu.TryLock() {
		state.release(g, c.Rank())
		return false
	}
	m.owner = g
	return true
}

func (m *Mutex[C]) Unlock() {
	var c C
	state.release(m.owner, c.Rank())
	m.mu.Unlock()
}

// goid is the calling goroutine's id, from the first line of its stack
// ("goroutine 42 [running]:"): slow, and only in this build.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		panic("lockrank: cannot read the goroutine id: " + err.Error())
	}
	return id
}
