package testbed

// Reading and changing a namespace's nftables by netlink (google/nftables,
// as the plugin writes them), so that no test needs the nft command.

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// nftAt runs f with an nftables connection to the namespace at path.
func nftAt(path string, f func(c *nftables.Conn) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	c, err := nftutil.Conn(ns)
	if err != nil {
		return err
	}
	return f(c)
}

var familyNames = map[nftables.TableFamily]string{
	nftables.TableFamilyINet: "inet", nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6",
	nftables.TableFamilyARP: "arp", nftables.TableFamilyNetdev: "netdev", nftables.TableFamilyBridge: "bridge",
}

// NftTables lists the tables of the namespace at path as nft names them:
// "family name".
func NftTables(path string) ([]string, error) {
	var out []string
	err := nftAt(path, func(c *nftables.Conn) error {
		tables, err := c.ListTables()
		if err != nil {
			return fmt.Errorf("list nftables tables: %w", err)
		}
		for _, t := range tables {
			out = append(out, familyNames[t.Family]+" "+t.Name)
		}
		return nil
	})
	return out, err
}

// NftPackets sums the packet counters of the rules of chain in the inet
// table of the namespace at path; a chain without rules is an error.
func NftPackets(path, table, chain string) (uint64, error) {
	var sum uint64
	err := nftAt(path, func(c *nftables.Conn) error {
		rules, err := c.GetRules(&nftables.Table{Name: table, Family: nftables.TableFamilyINet}, &nftables.Chain{Name: chain})
		if err != nil {
			return fmt.Errorf("list chain inet %s %s: %w", table, chain, err)
		}
		if len(rules) == 0 {
			return fmt.Errorf("no rule in chain inet %s %s of %s", table, chain, path)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if ctr, ok := e.(*expr.Counter); ok {
					sum += ctr.Packets
				}
			}
		}
		return nil
	})
	return sum, err
}

// NftDropPort makes the inet table name in the namespace at path, whose
// chains drop every TCP and UDP packet to or from port, in and out, ahead
// of any other filter; DelNftTable removes it.
func NftDropPort(path, name string, port uint16) error {
	return nftAt(path, func(c *nftables.Conn) error {
		t := c.AddTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
		prio := nftables.ChainPriority(-300)
		for _, hook := range []*nftables.ChainHook{nftables.ChainHookInput, nftables.ChainHookOutput} {
			ch := c.AddChain(&nftables.Chain{Table: t, Name: fmt.Sprintf("hook%d", *hook),
				Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: &prio})
			for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				for _, offset := range []uint32{0, 2} { // source, destination port
					c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
						&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
						&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: offset, Len: 2},
						&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
						&expr.Verdict{Kind: expr.VerdictDrop},
					}})
				}
			}
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("make table inet %s: %w", name, err)
		}
		return nil
	})
}

// DelNftTable removes the inet table name from the namespace at path.
func DelNftTable(path, name string) error {
	return nftAt(path, func(c *nftables.Conn) error {
		c.DelTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("delete table inet %s: %w", name, err)
		}
		return nil
	})
}
