// Package netlinkutil holds the netlink helpers that the kernel-facing
// packages (kernel, encryption) share, so that each rule lives once.
package netlinkutil

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// dumpRetries bounds the retries of a dump the kernel reports as
// interrupted by a concurrent change.
const dumpRetries = 5

// Dump runs list, a netlink dump, again while the kernel reports it as
// interrupted (NLM_F_DUMP_INTR, netlink.ErrDumpInterrupted): the table
// changed during the dump, so the result may miss or repeat entries. A busy
// host makes that common; vishvananda/netlink documents that its list calls
// return it. After dumpRetries interrupted attempts it gives up with that
// error.
func Dump[T any](list func() (T, error)) (T, error) {
	var out T
	var err error
	for range dumpRetries {
		out, err = list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	var zero T
	return zero, err
}
