package health

import (
	"net/netip"
	"time"
)

// Path names what a probe crosses: plain VXLAN, or VXLAN inside ESP.
type Path string

const (
	PathVXLAN Path = "vxlan"
	PathESP   Path = "esp"
)

// State is a path's health.
type State string

const (
	// StateUnknown: not probed long enough to tell.
	StateUnknown State = "unknown"
	StateUp      State = "up"
	// StateDown: full-size and small probes go unanswered.
	StateDown State = "down"
	// StateMTU: small probes are answered, packets of the network's MTU
	// are not.
	StateMTU State = "mtu"
	// StateUnprobed: the peer runs a release without a health endpoint.
	StateUnprobed State = "unprobed"
)

// Peer is a remote VTEP this host has programmed, as the prober needs it.
type Peer struct {
	VTEP netip.Addr
	// MTU is the largest MTU of this host's networks that reach the peer;
	// ESPMTU that of the encrypted ones, 0 when none does (then its ESP
	// path is not probed).
	MTU, ESPMTU int
}

// PathStatus is what the prober knows of one path to one peer.
type PathStatus struct {
	Peer  netip.Addr `json:"peer"`
	Path  Path       `json:"path"`
	State State      `json:"state"`
	// Since is when State began.
	Since time.Time `json:"since"`
	// RTT of the last answered probe.
	RTT time.Duration `json:"rtt_ns"`
	// MTU is the size probed: the network's MTU. PathMTU is the largest
	// packet seen crossing: MTU while up, what the last search found
	// while in StateMTU, 0 when unknown.
	MTU     int `json:"mtu"`
	PathMTU int `json:"path_mtu"`
	// Sent and Answered count probes.
	Sent     uint64 `json:"sent"`
	Answered uint64 `json:"answered"`
	// Problem is an operator's sentence: what fails, and the likely cause.
	// Empty while the path is up.
	Problem string `json:"problem,omitempty"`
}

// Broken reports a path an operator must hear of.
func (s PathStatus) Broken() bool { return s.State == StateDown || s.State == StateMTU }
