package statedb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// bbolt's on-disk meta page, read here with plain file reads before bbolt
// maps the file: bbolt trusts the page ids a meta page names, and reading
// a page past the end of a truncated file through its mapping is SIGBUS,
// which no recover() catches. The layout is bbolt's (internal/common's
// Page and Meta, native byte order); its own check, Meta.Validate, is not
// exported, so checkMeta repeats it.
const (
	pageHeaderSize = 16 // id, flags, count, overflow
	metaSize       = 64 // through the checksum
	metaSumLen     = 56 // the checksum covers everything before it
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	noFreelist     = ^uint64(0)
)

// meta is the part of a meta page that decides what bbolt will read.
type meta struct {
	pageSize uint32
	root     uint64 // page of the root bucket
	freelist uint64 // noFreelist when none is stored
	pgid     uint64 // high-water mark: pages in use are below it
	txid     uint64
}

// decodeMeta reads the meta page whose first byte is b[0], checking its
// magic, version and checksum as bbolt does.
func decodeMeta(b []byte) (meta, error) {
	if len(b) < pageHeaderSize+metaSize {
		return meta{}, errors.New("too short")
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	ne := binary.NativeEndian
	switch {
	case ne.Uint32(m[0:]) != boltMagic:
		return meta{}, errors.New("no bbolt magic number")
	case ne.Uint32(m[4:]) != boltVersion:
		return meta{}, fmt.Errorf("bbolt file format %d, not %d", ne.Uint32(m[4:]), boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:metaSumLen])
	if h.Sum64() != ne.Uint64(m[56:]) {
		return meta{}, errors.New("checksum mismatch")
	}
	return meta{pageSize: ne.Uint32(m[8:]), root: ne.Uint64(m[16:]), freelist: ne.Uint64(m[32:]),
		pgid: ne.Uint64(m[40:]), txid: ne.Uint64(m[48:])}, nil
}

// checkMeta validates the file f of size bytes as bbolt will map it: at
// least one valid meta page, and every page the chosen one (bbolt's
// choice: the valid one with the highest transaction id) names lying
// within the file. It returns the chosen meta, and a note when the other
// meta page is unusable (bbolt then runs on the one before the last
// commit, its own recovery from a torn write).
func checkMeta(f io.ReaderAt, size int64) (meta, string, error) {
	first := make([]byte, pageHeaderSize+metaSize)
	n, _ := f.ReadAt(first, 0)
	m0, err0 := decodeMeta(first[:n])
	// The second meta page sits one page further: bbolt tries every page
	// size it supports when the first one cannot say.
	sizes := []int64{int64(os.Getpagesize())}
	if err0 == nil {
		sizes = []int64{int64(m0.pageSize)}
	} else {
		for s := int64(1024); s <= 16<<20; s <<= 1 {
			sizes = append(sizes, s)
		}
	}
	var m1 meta
	err1 := errors.New("missing")
	for _, s := range sizes {
		buf := make([]byte, pageHeaderSize+metaSize)
		n, _ := f.ReadAt(buf, s)
		if m1, err1 = decodeMeta(buf[:n]); err1 == nil {
			break
		}
	}
	var m meta
	var note string
	switch {
	case err0 != nil && err1 != nil:
		return meta{}, "", fmt.Errorf("neither meta page is valid (first: %v; second: %v)", err0, err1)
	case err0 != nil:
		m, note = m1, fmt.Sprintf("first meta page invalid (%v)", err0)
	case err1 != nil:
		m, note = m0, fmt.Sprintf("second meta page invalid (%v)", err1)
	case m1.txid > m0.txid:
		m = m1
	default:
		m = m0
	}
	ps := uint64(m.pageSize)
	if ps < 512 || ps&(ps-1) != 0 {
		return meta{}, "", fmt.Errorf("meta page names page size %d", m.pageSize)
	}
	if m.pgid < 4 || m.pgid > uint64(size)/ps {
		return meta{}, "", fmt.Errorf("the database spans %d pages of %d bytes but the file holds %d bytes: it is truncated", m.pgid, ps, size)
	}
	if m.root < 2 || m.root >= m.pgid || (m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid)) {
		return meta{}, "", fmt.Errorf("meta page names pages outside the database (root %d, freelist %d, %d pages)", m.root, m.freelist, m.pgid)
	}
	return m, note, nil
}
