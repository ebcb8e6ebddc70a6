package driver

import (
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// groupCommit runs the driver's state writes with group commit: whatever
// arrives while a transaction is being committed goes into the next one,
// so concurrent Joins on distinct networks share an fsync instead of
// queueing one by one for bbolt's single writer. A write returns once the
// transaction holding it is committed (synced), so "written before the
// API call returns" holds as with a transaction of its own; a lone write
// is committed at once (bbolt's Batch would wait MaxBatchDelay for
// company).
type groupCommit struct {
	db *bbolt.DB

	mu    lockrank.Mutex[lockrank.GroupCommit] // guards queue and busy; a leaf
	queue []pendingWrite
	busy  bool // a committer goroutine runs
}

type pendingWrite struct {
	fn   func(*bbolt.Tx) error
	done chan error
}

// update runs fn in a committed read-write transaction, perhaps shared
// with other writes; fn may run more than once (see commit).
func (g *groupCommit) update(fn func(*bbolt.Tx) error) error {
	done := make(chan error, 1)
	g.mu.Lock()
	g.queue = append(g.queue, pendingWrite{fn, done})
	if !g.busy {
		g.busy = true
		go g.run()
	}
	g.mu.Unlock()
	return <-done
}

// run commits the queue until it is empty.
func (g *groupCommit) run() {
	for {
		g.mu.Lock()
		batch := g.queue
		g.queue = nil
		if len(batch) == 0 {
			g.busy = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.commit(batch)
	}
}

// commit writes batch in one transaction. If that fails, each write is
// run again in a transaction of its own, so a failing write fails only
// its caller: the writes are puts and deletes, which repeat harmlessly.
func (g *groupCommit) commit(batch []pendingWrite) {
	err := g.db.Update(func(tx *bbolt.Tx) error {
		for _, w := range batch {
			if err := w.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for _, w := range batch {
			w.done <- err
		}
		return
	}
	for _, w := range batch {
		w.done <- g.db.Update(w.fn)
	}
}
