package testbed

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
)

// RandomHex is n random hex digits (n even); 64 make a Docker endpoint id.
func RandomHex(n int) string {
	b := make([]byte, n/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// SwarmID is a 25-character base-36 id like swarm's network ids.
func SwarmID() string {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	b := make([]byte, 25)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = digits[int(b[i])%len(digits)]
	}
	return string(b)
}

// Nth is the i-th address of p (0 is p's own address).
func Nth(p netip.Prefix, i int) netip.Addr {
	a := p.Masked().Addr()
	for range i {
		a = a.Next()
	}
	return a
}
