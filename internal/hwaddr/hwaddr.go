// Package hwaddr holds the Ethernet MAC address as a comparable value, so it
// can key maps (FDB refcounts, peer tables) and cross goroutines by copy.
package hwaddr

import (
	"fmt"
	"net"
)

// MAC is a 48-bit Ethernet address.
type MAC [6]byte

// Parse accepts the usual colon- or dash-separated forms of a 48-bit MAC.
func Parse(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil {
		return MAC{}, fmt.Errorf("invalid MAC address %q: %w", s, err)
	}
	if len(hw) != 6 {
		return MAC{}, fmt.Errorf("invalid MAC address %q: not 48 bits", s)
	}
	return MAC(hw), nil
}

// FromHardwareAddr converts a 6-byte net.HardwareAddr.
func FromHardwareAddr(hw net.HardwareAddr) (MAC, bool) {
	if len(hw) != 6 {
		return MAC{}, false
	}
	return MAC(hw), true
}

// IsZero reports the all-zero address, which VXLAN FDBs use for flooding.
func (m MAC) IsZero() bool { return m == MAC{} }

// HardwareAddr returns a fresh net.HardwareAddr copy.
func (m MAC) HardwareAddr() net.HardwareAddr { return append(net.HardwareAddr(nil), m[:]...) }

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// MarshalText makes MAC encode as its string form in JSON.
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses the string form.
func (m *MAC) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
