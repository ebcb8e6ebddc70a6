// Package statedb opens the plugin's state database (bbolt) so that a
// damaged file stops the plugin with a clear error instead of either
// crashing it or being taken for an empty one. What the plugin forgets it
// would remove from the kernel, and hand out again (VNIs), so a state file
// that cannot be read whole is refused and left exactly as it is for the
// operator, who can move it aside to start afresh.
//
// Opening goes in steps, each before anything can write:
//
//  1. A missing file is a new database: it is built under a temporary name
//     and renamed into place, so a crash while creating it never leaves a
//     0-byte or half-written state.db behind. An existing file is never
//     new, whatever its size.
//  2. The meta pages are read with plain file reads and every page they
//     name must lie within the file (checkMeta): bbolt maps the file and
//     trusts them, and reading past the end of a truncated file through
//     the mapping is SIGBUS.
//  3. bbolt opens it read-only, every bucket and record is read, and
//     bbolt's own consistency check (Tx.Check) runs. bbolt panics on
//     garbled pages ("Page expected to be..."), and a garbled page id can
//     point outside the mapping: these steps run with recover() and
//     debug.SetPanicOnFault, so both become errors.
//  4. The schema version is checked: a newer one is refused.
//  5. Only then is the file opened for writing, and a version-1 database
//     from before versions existed gets its version written.
package statedb

import (
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"time"

	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Version is the schema this build writes and reads: the buckets below,
// JSON records in the driver's buckets (see driver/store.go), 4-byte VNIs
// in the VNI table's.
const Version = 1

// v1Buckets are the buckets of a version-1 database. A database from
// before versions existed that holds only these (or none) is version 1.
var v1Buckets = []string{"driver.networks", "driver.endpoints", "vni.by-vni", "vni.by-network", "encryption"}

var (
	bucketMeta = []byte("statedb")
	keyVersion = []byte("version")
)

// Errors for errors.Is; the messages say what is wrong and what to do.
var (
	// ErrLocked: another process holds the database.
	ErrLocked = errors.New("state database is locked")
	// ErrUnreadable: the file is damaged, or not a state database.
	ErrUnreadable = errors.New("state database is unreadable")
	// ErrNewerVersion: a newer plugin wrote it.
	ErrNewerVersion = errors.New("state database is of a newer version")
)

// Options tune Open.
type Options struct {
	// LockWait is how long to wait for another process's lock.
	LockWait time.Duration
	Logger   *slog.Logger
}

// Open opens the state database at path, creating it if the file does not
// exist. A file that is damaged, not a state database, or of a newer
// schema version is refused with an error wrapping ErrUnreadable or
// ErrNewerVersion and stays untouched.
func Open(path string, opts Options) (*bbolt.DB, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		if err := create(path); err != nil {
			return nil, fmt.Errorf("create state database %s: %w", path, err)
		}
		log.Info("created a new state database", "path", path, "version", Version)
	} else if err != nil {
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	version, err := validate(path, opts.LockWait, log)
	if err != nil {
		return nil, err
	}
	db, err := openWritable(path, opts.LockWait)
	if err != nil {
		return nil, err
	}
	if version == 0 {
		if err := db.Update(writeVersion); err != nil {
			db.Close()
			return nil, fmt.Errorf("state database %s: record schema version %d: %w", path, Version, err)
		}
		log.Info("state schema recorded", "path", path, "version", Version)
	}
	return db, nil
}

// create builds an empty database of the current version at path, by way
// of a temporary file renamed into place.
func create(path string) error {
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	db, err := bbolt.Open(tmp, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	err = db.Update(writeVersion)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func writeVersion(tx *bbolt.Tx) error {
	b, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	return b.Put(keyVersion, []byte(strconv.Itoa(Version)))
}

// unreadable is the error for a file that cannot be used as it is.
func unreadable(path, what string) error {
	return fmt.Errorf("%w: %s: %s. The plugin leaves the file untouched and does not start, since "+
		"it would remove the running networks it could not find in it and hand their VNIs out again. "+
		"Restore a backup, or move the file aside (mv %s %s.bad) to start with empty state: the plugin "+
		"then adopts the sandboxes still running on this host", ErrUnreadable, path, what, path, path)
}

func locked(path string) error {
	return fmt.Errorf("%w: %s: another overlay-plugin instance is using state directory %s (give each instance its own --state-dir)",
		ErrLocked, path, filepath.Dir(path))
}

// validate checks the file without writing to it and returns its schema
// version (0: from before versions, to be recorded).
func validate(path string, lockWait time.Duration, log *slog.Logger) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("state database %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, fmt.Errorf("state database %s: %w", path, err)
	}
	if st.Size() == 0 {
		f.Close()
		return 0, unreadable(path, "the file is empty (0 bytes), not a new database: the plugin creates its database whole")
	}
	_, note, err := checkMeta(f, st.Size())
	f.Close()
	if err != nil {
		return 0, unreadable(path, err.Error())
	}
	if note != "" {
		log.Warn("state meta page damaged", "why", "bbolt uses the other of its two meta pages, so the last change before a crash may be missing",
			"path", path, "detail", note)
	}
	var version int
	file, openFile := fileOf()
	err = guard(func() error {
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: lockWait, OpenFile: openFile})
		if err != nil {
			return err
		}
		defer db.Close()
		return db.View(func(tx *bbolt.Tx) error {
			if err := readAll(tx); err != nil {
				return err
			}
			// Drain Check whole: its goroutine reads the mapping until it
			// has sent every error, so it must end before the file closes.
			var errs []error
			for err := range tx.Check() {
				errs = append(errs, err)
			}
			if len(errs) > 0 {
				return fmt.Errorf("bbolt's consistency check: %w", errors.Join(errs[:min(3, len(errs))]...))
			}
			version, err = schemaVersion(path, tx)
			return err
		})
	})
	if err != nil && *file != nil {
		(*file).Close() // bbolt's, if it panicked before closing it
	}
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return 0, locked(path)
	case errors.Is(err, ErrNewerVersion), errors.Is(err, ErrUnreadable):
		return 0, err
	case err != nil:
		return 0, unreadable(path, err.Error())
	}
	return version, nil
}

// openWritable opens the validated file for writing.
func openWritable(path string, lockWait time.Duration) (*bbolt.DB, error) {
	var db *bbolt.DB
	file, openFile := fileOf()
	err := guard(func() (err error) {
		db, err = bbolt.Open(path, 0o600, &bbolt.Options{Timeout: lockWait, OpenFile: openFile})
		return err
	})
	if err != nil && *file != nil {
		(*file).Close()
	}
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, locked(path)
	case err != nil:
		return nil, unreadable(path, err.Error())
	}
	return db, nil
}

// guard runs f, turning a panic, and a memory fault in the mapped file
// (SIGBUS, SIGSEGV), into an error. bbolt reads the file through its
// mapping on the calling goroutine, except Tx.Check, which reads in a
// goroutine of its own (and recovers panics itself): readAll runs first
// and reads every page Check reads.
func guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bbolt failed reading it: %v", r)
		}
	}()
	return f()
}

// fileOf returns an OpenFile for bbolt that records the file it opens, so
// that a panic inside bbolt.Open does not leave it open (and locked).
func fileOf() (**os.File, func(string, int, os.FileMode) (*os.File, error)) {
	var file *os.File
	return &file, func(name string, flag int, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, mode)
		file = f
		return f, err
	}
}

// readAll reads every key and value of every bucket, so that a damaged
// page fails here, under guard.
func readAll(tx *bbolt.Tx) error {
	return tx.ForEach(func(_ []byte, b *bbolt.Bucket) error { return readBucket(b) })
}

func readBucket(b *bbolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		crc32.ChecksumIEEE(k)
		if v != nil {
			crc32.ChecksumIEEE(v)
			return nil
		}
		if sub := b.Bucket(k); sub != nil {
			return readBucket(sub)
		}
		return nil
	})
}

// schemaVersion reads the version a database records, or infers 0 for one
// from before versions that holds nothing but version-1 buckets.
func schemaVersion(path string, tx *bbolt.Tx) (int, error) {
	if b := tx.Bucket(bucketMeta); b != nil {
		raw := b.Get(keyVersion)
		v, err := strconv.Atoi(string(raw))
		switch {
		case err != nil || v < 1:
			return 0, unreadable(path, fmt.Sprintf("its schema version %q is not a version", raw))
		case v > Version:
			return 0, fmt.Errorf("%w: %s has schema version %d, written by a newer overlay-plugin; this one reads version %d. "+
				"The file is left untouched: run the newer plugin again, or move the file aside (mv %s %s.v%d) to start this "+
				"one with empty state (it then adopts the sandboxes still running on this host)",
				ErrNewerVersion, path, v, Version, path, path, v)
		}
		return v, nil
	}
	var foreign []string
	err := tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
		for _, known := range v1Buckets {
			if string(name) == known {
				return nil
			}
		}
		foreign = append(foreign, string(name))
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(foreign) > 0 {
		return 0, unreadable(path, fmt.Sprintf("it records no schema version and holds buckets %q that are not the plugin's: it is not an overlay-plugin state database", foreign))
	}
	return 0, nil
}
