//go:build lockrank

package lockrank

import (
	"strings"
	"sync"
	"testing"
)

// In the checking build, a Lock out of order panics naming both locks,
// and a sync.Cond over a Mutex keeps the bookkeeping straight.
func TestCheckedMutex(t *testing.T) {
	var n Mutex[Network]
	var d Mutex[Driver]
	n.Lock()
	d.Lock()
	d.Unlock()
	n.Unlock()

	d.Lock()
	func() {
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(r.(error).Error(), "takes Network (rank 1) while holding Driver") {
				t.Errorf("Network under Driver: recovered %v, want a violation", r)
			}
		}()
		n.Lock()
	}()
	d.Unlock()

	c := sync.NewCond(&n)
	done := make(chan struct{})
	n.Lock()
	go func() {
		n.Lock()
		c.Signal()
		n.Unlock()
		close(done)
	}()
	c.Wait()
	n.Unlock()
	<-done
	if len(state.by) != 0 {
		t.Fatalf("held after every unlock: %v", state.by)
	}
}
