package encryption

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

func testStore(t *testing.T) KeyStore {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return KeyStore{DB: db}
}

// The keys stored by one run come back to the next on the same address
// only, and an unreadable record resumes nothing.
func TestKeyStoreResume(t *testing.T) {
	s := testStore(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, other := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.9")
	if keys := s.Resume(addr, log); keys != nil {
		t.Fatalf("nothing stored, yet %v", keys)
	}
	keys := []PublicKey{{Gen: 7, Key: make([]byte, 32), ActivateAt: time.Unix(100, 0).UTC()}}
	if err := s.Save(addr, keys); err != nil {
		t.Fatal(err)
	}
	if got := s.Resume(addr, log); len(got) != 1 || got[0].Gen != 7 || !got[0].ActivateAt.Equal(keys[0].ActivateAt) {
		t.Fatalf("same address: %+v", got)
	}
	if got := s.Resume(other, log); got != nil {
		t.Fatalf("another address: %+v", got)
	}
	if err := s.DB.Update(func(tx *bbolt.Tx) error { return tx.Bucket(keysBucket).Put(keysKey, []byte("garbage")) }); err != nil {
		t.Fatal(err)
	}
	if got := s.Resume(addr, log); got != nil {
		t.Fatalf("unreadable record: %+v", got)
	}
}

type nodeData struct{ got chan []byte }

func (n nodeData) SetNodeData(b []byte) error { n.got <- b; return nil }

// Publishing (under the encryption mutex) never waits for the disk: the
// keys reach gossip at once while the database is busy, and are stored
// once it is free, the pending ones at the latest when Run stops.
func TestPublisherDoesNotWaitForTheDisk(t *testing.T) {
	s := testStore(t)
	addr := netip.MustParseAddr("198.51.100.1")
	p := NewPublisher(s, addr, slog.New(slog.NewTextHandler(io.Discard, nil)))
	node := nodeData{make(chan []byte, 4)}
	p.Attach(node)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { p.Run(ctx); close(ran) }()

	// A writer holds the database.
	holding, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = s.DB.Update(func(*bbolt.Tx) error { close(holding); <-release; return nil })
	}()
	<-holding
	keys := []PublicKey{{Gen: 3, Key: make([]byte, 32), ActivateAt: time.Unix(200, 0).UTC()}}
	published := make(chan struct{})
	go func() { p.Publish(keys); close(published) }()
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish waited for the database")
	}
	select {
	case <-node.got:
	case <-time.After(5 * time.Second):
		t.Fatal("the keys did not reach gossip")
	}
	cancel()
	close(release)
	<-ran
	if got := s.Resume(addr, slog.New(slog.NewTextHandler(io.Discard, nil))); len(got) != 1 || got[0].Gen != 3 {
		t.Fatalf("stored after Run stopped: %+v", got)
	}
}
