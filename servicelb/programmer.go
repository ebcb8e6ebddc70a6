package servicelb

import (
	"fmt"
	"os"
)

// ErrNoSandbox means there is no network namespace at the path given: the
// sandbox is gone. It wraps os.ErrNotExist.
var ErrNoSandbox = fmt.Errorf("no network namespace there (sandbox gone?): %w", os.ErrNotExist)

// Programmer keeps the load-balancing table of client sandboxes. Its
// methods are safe to call from several goroutines at once for different
// sandboxes; calls for one sandbox must be serialised by the caller (the
// last Apply wins, and one that overlaps another may carry over slightly
// stale counters).
//
// A sandbox is named by the path of its network namespace file (Docker's
// SandboxKey, or any nsfs file such as /proc/PID/ns/net). When there is
// no namespace there any more, Apply and Counters return an error that
// wraps ErrNoSandbox (and os.ErrNotExist), and Remove succeeds: the
// sandbox is gone.
type Programmer interface {
	// Apply makes the sandbox balance exactly svcs, replacing whatever it
	// balanced before, in one atomic step: a connection to a VIP starts
	// either under the old rules or under the new ones. Existing
	// connections keep their backend, except UDP flows to a removed
	// backend, which the next datagram balances anew. Each backend's
	// connection count carries over. Invalid input (see Normalize)
	// changes nothing and returns an error wrapping ErrInvalid. No
	// services removes the table.
	Apply(nsPath string, svcs []Service) error
	// Counters returns how many connections each backend of each service
	// was given in this sandbox since Apply added it (a backend removed
	// and added again starts from zero), none if the sandbox has no table.
	Counters(nsPath string) (map[Backend]uint64, error)
	// Remove deletes the table from the sandbox. Neither a missing table
	// nor a missing namespace is an error.
	Remove(nsPath string) error
	// Stats counts the batches written since the Programmer was made.
	Stats() Stats
}

// Stats counts a Programmer's batches, for benchmarks and inspection.
type Stats struct {
	// Replaces are batches that wrote a whole table: a sandbox's first,
	// and any after the table was found other than last written.
	Replaces uint64
	// Increments are batches that changed only the services that differ.
	Increments uint64
	// Fallbacks are incremental batches refused, then made good by a
	// replace.
	Fallbacks uint64
	// Objects are the nf_tables objects all batches wrote: tables, chains,
	// rules, sets, set elements, and the deletions of any of them.
	Objects uint64
}
