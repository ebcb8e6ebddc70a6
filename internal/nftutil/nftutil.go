// Package nftutil holds the google/nftables helpers that the packages
// keeping a table of their own (firewall, servicelb) share: a connection to
// a given network namespace, rule comments, and the idempotent removal of a
// table inside a batch.
package nftutil

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
)

// Conn returns an nftables connection to namespace ns (zero or
// netns.None(): the caller's current namespace), with opts (for example
// nftables.AsLasting) applied after the namespace. Unless it is lasting,
// every batch and dump dials a fresh socket, so ns must stay open while the
// connection is used.
func Conn(ns netns.NsHandle, opts ...nftables.ConnOption) (*nftables.Conn, error) {
	if ns != 0 && ns != netns.None() {
		opts = append([]nftables.ConnOption{nftables.WithNetNSFd(int(ns))}, opts...)
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables connection: %w", err)
	}
	return c, nil
}

// Comment encodes s as a rule's userdata comment, as nft shows it.
func Comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

// QueueRemoveTable queues the removal of t whether or not it exists:
// adding an existing table is a no-op, so add-then-delete never fails on
// absence, and in a batch that goes on to create t afresh it replaces
// whatever was there atomically.
func QueueRemoveTable(c *nftables.Conn, t *nftables.Table) {
	c.AddTable(t)
	c.DelTable(t)
}

// HasTable reports whether the kernel has table t (by name and family).
func HasTable(c *nftables.Conn, t *nftables.Table) (bool, error) {
	tables, err := c.ListTablesOfFamily(t.Family)
	if err != nil {
		return false, fmt.Errorf("list tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == t.Name }), nil
}

// Available says whether this kernel serves nf_tables here: nil when a
// dump of its tables answers.
func Available() error {
	c, err := Conn(netns.None())
	if err != nil {
		return err
	}
	if _, err := c.ListTables(); err != nil {
		return fmt.Errorf("nf_tables: %w", err)
	}
	return nil
}
