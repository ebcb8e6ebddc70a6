package main

import (
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// TestKeysToResume: the keys stored by one run come back to the next on
// the same address only, and an unreadable record resumes nothing.
func TestKeysToResume(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	addr, other := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.9")
	if keys := keysToResume(db, addr, log); keys != nil {
		t.Fatalf("nothing stored, yet %v", keys)
	}
	keys := []encryption.PublicKey{{Gen: 7, Key: make([]byte, 32), ActivateAt: time.Unix(100, 0).UTC()}}
	b, err := encryption.EncodePublicKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	if err := saveKeys(db, addr, b); err != nil {
		t.Fatal(err)
	}
	if got := keysToResume(db, addr, log); len(got) != 1 || got[0].Gen != 7 || !got[0].ActivateAt.Equal(keys[0].ActivateAt) {
		t.Fatalf("same address: %+v", got)
	}
	if got := keysToResume(db, other, log); got != nil {
		t.Fatalf("another address: %+v", got)
	}
	if err := saveKeys(db, addr, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if got := keysToResume(db, addr, log); got != nil {
		t.Fatalf("unreadable record: %+v", got)
	}
}
