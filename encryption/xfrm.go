package encryption

import (
	"errors"
	"net/netip"
)

// Our xfrm identity. Docker's overlay uses mark 0xD0C4E3 and deletes every
// SA and policy carrying it when dockerd starts, so ours must differ.
const (
	// Mark is set by the firewall on outbound VXLAN of encrypted VNIs; the
	// outbound policies match it.
	Mark = 0x0E5C0DE0
	// ReqID ties our policies to our SAs.
	ReqID = 0x0E5C
	// ReplayWindow is the anti-replay window, in packets, of inbound SAs.
	ReplayWindow = 1024
)

// ErrNoESP is wrapped by the errors of XFRM.Check and AddSA on a kernel
// that cannot build ESP states with AEADName (no esp4/esp6, no gcm, or no
// rfc4106 template).
var ErrNoESP = errors.New("kernel lacks IPsec ESP with AES-GCM (" + AEADName + ")")

// XFRM programs ESP transport-mode SAs and policies for VXLAN between two
// hosts. Implementations: netlinkxfrm, and fakexfrm for tests. Calls are
// serialised by the Manager's mutex.
type XFRM interface {
	// Check reports, with a clear error, a kernel that lacks ESP or
	// rfc4106(gcm(aes)) (for example by adding and removing a probe SA).
	Check() error
	// AddSA installs the state for sa.Src→sa.Dst with sa.SPI and sa.Key:
	// ESP, transport mode, AEADName with ICVBits, extended sequence numbers
	// and ReplayWindow, reqid ReqID. Adding an existing SA (same dst, SPI)
	// replaces nothing and is not an error.
	AddSA(sa SA) error
	// DeleteSA removes the state (dst, spi); a missing one is not an error.
	DeleteSA(src, dst netip.Addr, spi uint32) error
	// SetPolicy makes outbound UDP to dst:port from src that carries Mark
	// use ESP with SA spi (template src→dst, reqid ReqID, that SPI):
	// created or updated in place, so a rotation switches atomically.
	SetPolicy(src, dst netip.Addr, port uint16, spi uint32) error
	// BlockPolicy makes the same traffic wait for an SA that does not
	// exist yet: it is dropped, never sent in clear (a template with no SA).
	BlockPolicy(src, dst netip.Addr, port uint16) error
	// DeletePolicy removes the outbound policy to dst; missing is fine.
	DeletePolicy(src, dst netip.Addr, port uint16) error
	// States and Policies list what is installed with ReqID / Mark.
	States() ([]StateInfo, error)
	Policies() ([]PolicyInfo, error)
	// Flush removes every state and policy of ours (at start and stop).
	Flush() error
}

// StateInfo is an installed SA, for reconciliation, inspection and tests.
type StateInfo struct {
	Src, Dst netip.Addr
	SPI      uint32
	Bytes    uint64 // lifetime byte counter
	Packets  uint64
}

// PolicyInfo is an installed outbound policy.
type PolicyInfo struct {
	Src, Dst netip.Addr
	Port     uint16
	SPI      uint32 // 0 for a blocking policy with no SA
}
