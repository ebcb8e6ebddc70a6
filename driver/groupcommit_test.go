package driver

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"go.etcd.io/bbolt"
)

// Concurrent writes are all committed when they return; one that fails
// fails alone.
func TestGroupCommit(t *testing.T) {
	db := testDB(t)
	g := &groupCommit{db: db}
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("refused")
	const writers = 64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			errs[i] = g.update(func(tx *bbolt.Tx) error {
				if i == 7 {
					return bad
				}
				return tx.Bucket([]byte("b")).Put(fmt.Appendf(nil, "k%d", i), []byte("v"))
			})
			if errs[i] == nil {
				// Committed: visible to a reader now.
				if err := db.View(func(tx *bbolt.Tx) error {
					if tx.Bucket([]byte("b")).Get(fmt.Appendf(nil, "k%d", i)) == nil {
						return errors.New("not there")
					}
					return nil
				}); err != nil {
					errs[i] = err
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if i == 7 && !errors.Is(err, bad) {
			t.Errorf("the failing write returned %v, want its own error", err)
		}
		if i != 7 && err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
}
