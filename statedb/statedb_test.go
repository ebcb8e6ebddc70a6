package statedb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

var quiet = Options{LockWait: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}

// populated writes a database like a running plugin's, with enough records
// to span several pages, closes it and returns its path and bytes.
func populated(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, name := range v1Buckets {
			b, err := tx.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			for i := range 200 {
				if err := b.Put(fmt.Appendf(nil, "key-%04d", i), bytes.Repeat([]byte{byte(i)}, 100)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, raw
}

// refused opens path, which holds want, and checks that Open fails with
// target and a message naming what to do, and that the file is unchanged.
func refused(t *testing.T, path string, want []byte, target error) {
	t.Helper()
	db, err := Open(path, quiet)
	if err == nil {
		db.Close()
		t.Fatalf("Open accepted a damaged database")
	}
	if !errors.Is(err, target) {
		t.Fatalf("Open: %v, want %v", err, target)
	}
	if !strings.Contains(err.Error(), "mv "+path) {
		t.Errorf("the error does not say what to do: %v", err)
	}
	got, rerr := os.ReadFile(path)
	if rerr != nil || !bytes.Equal(got, want) {
		t.Fatalf("the refused file changed (%d bytes, was %d; %v)", len(got), len(want), rerr)
	}
	if _, serr := os.Stat(path + ".new"); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("a new database was started beside the refused one: %v", serr)
	}
	t.Logf("refused: %v", err)
}

func TestNewDatabaseRecordsItsVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bbolt.Tx) error {
		v, err := schemaVersion(path, tx)
		if err == nil && v != Version {
			err = fmt.Errorf("version %d, want %d", v, Version)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
}

func TestReopen(t *testing.T) {
	path, _ := populated(t)
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatalf("reopen a sound database: %v", err)
	}
	db.Close()
}

func TestEmptyFileIsUnreadableNotNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t, path, []byte{}, ErrUnreadable)
}

// TestTruncated cuts the file short of the pages the database uses. (The
// file grows ahead of use: cutting only unused pages off loses nothing.)
func TestTruncated(t *testing.T) {
	_, raw := populated(t)
	m := metaOf(t, raw)
	ps, used := int(m.pageSize), int(m.pgid)*int(m.pageSize)
	for _, size := range []int{1, 100, ps - 1, ps, ps + 100, 2 * ps, 3 * ps, used / 2, used - ps, used - 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, raw[:size], 0o600); err != nil {
				t.Fatal(err)
			}
			refused(t, path, raw[:size], ErrUnreadable)
		})
	}
}

// metaOf reads the meta page bbolt would use.
func metaOf(t *testing.T, raw []byte) meta {
	t.Helper()
	m, _, err := checkMeta(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func garble(raw []byte, page, pageSize int) []byte {
	out := bytes.Clone(raw)
	for i := page * pageSize; i < (page+1)*pageSize; i++ {
		out[i] = byte(i*7 + 3)
	}
	return out
}

// TestGarbledPages garbles the pages bbolt reads (the root bucket's and
// the freelist), then every page in turn: a page in use is refused, a free
// one may pass, and nothing panics or faults.
func TestGarbledPages(t *testing.T) {
	_, raw := populated(t)
	m := metaOf(t, raw)
	ps := int(m.pageSize)
	mustFail := map[int]bool{int(m.root): true}
	if m.freelist != noFreelist {
		mustFail[int(m.freelist)] = true
	}
	for page := 2; page < int(m.pgid); page++ {
		t.Run(fmt.Sprint(page), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			bad := garble(raw, page, ps)
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			if mustFail[page] {
				refused(t, path, bad, ErrUnreadable)
				return
			}
			db, err := Open(path, quiet)
			if err == nil {
				db.Close()
				return
			}
			if !errors.Is(err, ErrUnreadable) {
				t.Fatalf("Open: %v, want ErrUnreadable", err)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, bad) {
				t.Fatal("the refused file changed")
			}
		})
	}
}

// TestGarbledPageIDs points a branch or leaf page's own id elsewhere: bbolt
// panics with "Page expected to be".
func TestGarbledPageIDs(t *testing.T) {
	_, raw := populated(t)
	m := metaOf(t, raw)
	ps := int(m.pageSize)
	bad := bytes.Clone(raw)
	// The page header's id is its first 8 bytes.
	copy(bad[int(m.root)*ps:], []byte{0xff, 0xff, 0, 0, 0, 0, 0, 0})
	path := filepath.Join(t.TempDir(), "state.db")
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t, path, bad, ErrUnreadable)
}

func TestGarbledMetaPages(t *testing.T) {
	_, raw := populated(t)
	ps := int(metaOf(t, raw).pageSize)
	t.Run("both", func(t *testing.T) {
		bad := garble(garble(raw, 0, ps), 1, ps)
		path := filepath.Join(t.TempDir(), "state.db")
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, path, bad, ErrUnreadable)
	})
	// A whole garbled meta page fails bbolt's own check.
	for _, page := range []int{0, 1} {
		t.Run(fmt.Sprint("page ", page), func(t *testing.T) {
			bad := garble(raw, page, ps)
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			refused(t, path, bad, ErrUnreadable)
		})
	}
	// A meta page torn after its header (a commit cut short) is bbolt's
	// own recovery: it runs on the other one, the commit before.
	for _, page := range []int{0, 1} {
		t.Run(fmt.Sprint("torn ", page), func(t *testing.T) {
			bad := bytes.Clone(raw)
			copy(bad[page*ps+pageHeaderSize+metaSumLen:], "torn....")
			path := filepath.Join(t.TempDir(), "state.db")
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := Open(path, quiet)
			if err != nil {
				t.Fatalf("one meta page left: %v", err)
			}
			db.Close()
		})
	}
}

func TestNewerVersionRefused(t *testing.T) {
	path, _ := populated(t)
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyVersion, []byte(fmt.Sprint(Version+1)))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	refused(t, path, raw, ErrNewerVersion)
}

func TestBadVersionRefused(t *testing.T) {
	path, _ := populated(t)
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyVersion, []byte("one")) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	refused(t, path, raw, ErrUnreadable)
}

// unversioned writes a database as the plugin did before versions.
func unversioned(t *testing.T, buckets ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUnversionedIsVersionOne(t *testing.T) {
	path := unversioned(t, v1Buckets...)
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyVersion); string(v) != "1" {
			return fmt.Errorf("version %q recorded, want 1", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestForeignDatabaseRefused(t *testing.T) {
	path := unversioned(t, "driver.networks", "something.else")
	raw, _ := os.ReadFile(path)
	refused(t, path, raw, ErrUnreadable)
}

func TestNotADatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	raw := bytes.Repeat([]byte("not a bbolt file\n"), 2000)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t, path, raw, ErrUnreadable)
}

func TestLocked(t *testing.T) {
	path, _ := populated(t)
	db, err := Open(path, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := Open(path, quiet); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}
