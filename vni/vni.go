// Package vni allocates VXLAN network identifiers to overlay networks. It
// runs on the swarm manager: Docker calls AllocateNetwork only on the leader,
// and every newly elected leader calls it again for the existing networks
// with the options previously returned, so reserving a VNI a network already
// holds must succeed. The table is kept in a bbolt database so it survives a
// plugin restart.
//
// Every mutation is one bbolt Update transaction and bbolt serialises
// writers, so an Allocator is safe for concurrent use without a lock of its
// own. Nothing is cached in memory: the database is the only state.
//
// A table that may have lost allocations (a state database moved aside, a
// plugin that was a worker when networks were made) must not hand those
// VNIs out again: Hold makes Allocate and Reserve wait while the caller
// records what the networks hold (Recover) from whoever knows.
package vni

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"
)

// Range is an inclusive VNI range.
type Range struct{ Min, Max uint32 }

// DefaultRange: Docker's built-in overlay allocates VNIs from 4096 upward on
// UDP 4789, so ours stay below.
var DefaultRange = Range{Min: 256, Max: 4095}

// UserRange: what a user may request explicitly.
var UserRange = Range{Min: 1, Max: 4095}

var (
	// bucketByVNI maps a 4-byte big-endian VNI to the network id holding it.
	// Big-endian keys sort numerically, which Allocate relies on.
	bucketByVNI = []byte("vni.by-vni")
	// bucketByNetwork maps a network id to its 4-byte big-endian VNI.
	bucketByNetwork = []byte("vni.by-network")
)

// Allocator hands out VNIs and remembers which network holds which.
type Allocator struct {
	db   *bbolt.DB
	auto Range
	// hold is set while allocations are being recovered: closed (and
	// cleared) when done. Atomic: read by every Allocate and Reserve.
	hold atomic.Pointer[holdState]
}

type holdState struct {
	done chan struct{}
	wait time.Duration
}

// Hold makes Allocate and Reserve wait for release, at most wait each,
// and fail after that with an error saying to retry (swarm's allocator
// retries a network whose allocation failed). Recover still works
// meanwhile. release may be called more than once.
func (a *Allocator) Hold(wait time.Duration) (release func()) {
	h := &holdState{done: make(chan struct{}), wait: wait}
	a.hold.Store(h)
	var once sync.Once
	return func() {
		once.Do(func() {
			a.hold.CompareAndSwap(h, nil)
			close(h.done)
		})
	}
}

// awaitRecovery waits for a Hold to be released.
func (a *Allocator) awaitRecovery() error {
	h := a.hold.Load()
	if h == nil {
		return nil
	}
	t := time.NewTimer(h.wait)
	defer t.Stop()
	select {
	case <-h.done:
		return nil
	case <-t.C:
		return fmt.Errorf("the VNIs in use are still being recovered (the local state was lost; the plugin asks the Docker engine): retry in a moment")
	}
}

// Recover records that networkID holds vni, as learnt from a running
// sandbox or from the engine's list of networks, unless the table says
// that network holds a VNI already. A VNI the table gives another
// network is an error: the table keeps its word.
func (a *Allocator) Recover(networkID string, vni uint32) error {
	if _, ok := a.Lookup(networkID); ok {
		return nil
	}
	return a.reserve(networkID, vni)
}

// Open prepares the allocator's buckets in db and returns an allocator whose
// Allocate draws from auto. auto must lie within UserRange, so that a VNI it
// hands out can be reserved again by the next leader.
func Open(db *bbolt.DB, auto Range) (*Allocator, error) {
	if db == nil {
		return nil, errors.New("vni: no database")
	}
	if auto.Min > auto.Max || !UserRange.contains(auto.Min) || !UserRange.contains(auto.Max) {
		return nil, fmt.Errorf("vni: automatic VNI range %s is not a non-empty range within %s", auto.text(), UserRange.text())
	}
	err := db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{bucketByVNI, bucketByNetwork} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %q: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vni: open VNI table: %w", err)
	}
	return &Allocator{db: db, auto: auto}, nil
}

// Reserve records that networkID holds vni, as requested by the user or as
// returned earlier to Docker. Reserving the VNI the network already holds
// succeeds and changes nothing.
func (a *Allocator) Reserve(networkID string, vni uint32) error {
	if err := a.awaitRecovery(); err != nil {
		return err
	}
	return a.reserve(networkID, vni)
}

func (a *Allocator) reserve(networkID string, vni uint32) error {
	if err := checkNetworkID(networkID); err != nil {
		return err
	}
	if !UserRange.contains(vni) {
		return outOfRange(vni)
	}
	return a.db.Update(func(tx *bbolt.Tx) error {
		byVNI, byNet, err := buckets(tx)
		if err != nil {
			return err
		}
		held, ok, err := getVNI(byNet, networkID)
		if err != nil {
			return err
		}
		if ok {
			if held == vni {
				return nil
			}
			return fmt.Errorf("network %s already has VNI %d and cannot also take VNI %d", networkID, held, vni)
		}
		if owner := byVNI.Get(vniKey(vni)); owner != nil {
			return fmt.Errorf("VNI %d is already used by network %s; choose another VNI or remove that network", vni, owner)
		}
		return put(byVNI, byNet, networkID, vni)
	})
}

// Allocate returns the VNI networkID holds, or else gives it the lowest free
// VNI of the automatic range.
func (a *Allocator) Allocate(networkID string) (uint32, error) {
	if err := checkNetworkID(networkID); err != nil {
		return 0, err
	}
	if err := a.awaitRecovery(); err != nil {
		return 0, err
	}
	var vni uint32
	err := a.db.Update(func(tx *bbolt.Tx) error {
		byVNI, byNet, err := buckets(tx)
		if err != nil {
			return err
		}
		held, ok, err := getVNI(byNet, networkID)
		if err != nil {
			return err
		}
		if ok {
			vni = held
			return nil
		}
		// Walk the taken VNIs of the range in order; the first gap is the
		// lowest free one.
		next := a.auto.Min
		c := byVNI.Cursor()
		for k, _ := c.Seek(vniKey(a.auto.Min)); k != nil; k, _ = c.Next() {
			if len(k) != 4 {
				return fmt.Errorf("VNI table is corrupt: key %x is not a 4-byte VNI", k)
			}
			taken := binary.BigEndian.Uint32(k)
			if taken > next || taken > a.auto.Max {
				break
			}
			next = taken + 1
		}
		if next > a.auto.Max {
			return fmt.Errorf("no free VNI left for network %s: all %d VNIs of the automatic range %s are in use; remove unused overlay networks", networkID, a.auto.Max-a.auto.Min+1, a.auto.text())
		}
		vni = next
		return put(byVNI, byNet, networkID, vni)
	})
	if err != nil {
		return 0, err
	}
	return vni, nil
}

// Release frees the VNI networkID holds. Releasing a network that holds none
// succeeds, since Docker may repeat FreeNetwork.
func (a *Allocator) Release(networkID string) error {
	if err := checkNetworkID(networkID); err != nil {
		return err
	}
	return a.db.Update(func(tx *bbolt.Tx) error {
		byVNI, byNet, err := buckets(tx)
		if err != nil {
			return err
		}
		held, ok, err := getVNI(byNet, networkID)
		if err != nil || !ok {
			return err
		}
		if err := byNet.Delete([]byte(networkID)); err != nil {
			return fmt.Errorf("release VNI %d of network %s: %w", held, networkID, err)
		}
		// Only drop the reverse entry if it is ours; never free another
		// network's VNI because of an inconsistent table.
		if owner := byVNI.Get(vniKey(held)); string(owner) == networkID {
			if err := byVNI.Delete(vniKey(held)); err != nil {
				return fmt.Errorf("release VNI %d of network %s: %w", held, networkID, err)
			}
		}
		return nil
	})
}

// Lookup returns the VNI networkID holds.
func (a *Allocator) Lookup(networkID string) (uint32, bool) {
	if networkID == "" {
		return 0, false
	}
	var (
		vni uint32
		ok  bool
	)
	err := a.db.View(func(tx *bbolt.Tx) error {
		_, byNet, err := buckets(tx)
		if err != nil {
			return err
		}
		vni, ok, err = getVNI(byNet, networkID)
		return err
	})
	if err != nil {
		return 0, false
	}
	return vni, ok
}

func (r Range) contains(v uint32) bool { return r.Min <= v && v <= r.Max }

// text formats the range for messages. Not String: the package API is fixed.
func (r Range) text() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

func outOfRange(vni uint32) error {
	const why = "Docker's built-in overlay driver allocates VNIs from 4096 upward on the same UDP port 4789, so higher VNIs could clash with its networks"
	switch {
	case vni == 0:
		return fmt.Errorf("VNI 0 is not valid: choose a VNI in the range %s", UserRange.text())
	case vni >= 1<<24:
		return fmt.Errorf("VNI %d is not a 24-bit VXLAN network identifier: choose a VNI in the range %s (%s)", vni, UserRange.text(), why)
	default:
		return fmt.Errorf("VNI %d is outside the allowed range %s: %s", vni, UserRange.text(), why)
	}
}

func checkNetworkID(id string) error {
	if id == "" {
		return errors.New("empty network id")
	}
	if len(id) > bbolt.MaxKeySize {
		return fmt.Errorf("network id of %d bytes is too long", len(id))
	}
	return nil
}

func buckets(tx *bbolt.Tx) (byVNI, byNet *bbolt.Bucket, err error) {
	byVNI, byNet = tx.Bucket(bucketByVNI), tx.Bucket(bucketByNetwork)
	if byVNI == nil || byNet == nil {
		return nil, nil, errors.New("VNI table is missing from the database")
	}
	return byVNI, byNet, nil
}

func getVNI(byNet *bbolt.Bucket, networkID string) (uint32, bool, error) {
	v := byNet.Get([]byte(networkID))
	if v == nil {
		return 0, false, nil
	}
	if len(v) != 4 {
		return 0, false, fmt.Errorf("VNI table is corrupt: network %s maps to %x, not a 4-byte VNI", networkID, v)
	}
	return binary.BigEndian.Uint32(v), true, nil
}

func put(byVNI, byNet *bbolt.Bucket, networkID string, vni uint32) error {
	k := vniKey(vni)
	if err := byVNI.Put(k, []byte(networkID)); err != nil {
		return fmt.Errorf("record VNI %d for network %s: %w", vni, networkID, err)
	}
	if err := byNet.Put([]byte(networkID), k); err != nil {
		return fmt.Errorf("record VNI %d for network %s: %w", vni, networkID, err)
	}
	return nil
}

func vniKey(vni uint32) []byte { return binary.BigEndian.AppendUint32(nil, vni) }
