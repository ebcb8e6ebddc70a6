package encryption

import "net/netip"

// SecretsStatus is the cluster's keyring as this node sees it, for
// `overlay-plugin cluster` and metrics.
type SecretsStatus struct {
	// Held are the ids of this node's secrets, primary first.
	Held []string `json:"held"`
	// FileError is why the secret file's last reading was refused (the
	// secrets held stay in use); empty when it was not.
	FileError string          `json:"fileError,omitempty"`
	Members   []MemberSecrets `json:"members"`
}

// MemberSecrets is what one other live member holds, and uses with this
// node.
type MemberSecrets struct {
	Name string     `json:"name"`
	VTEP netip.Addr `json:"vtep"`
	// Secrets are the ids of the secrets it said it holds, primary first;
	// none from a member that says none (release 0.1.0).
	Secrets []string `json:"secrets,omitempty"`
	// LacksPrimary flags a member that said its secrets and holds none
	// of this node's primary: the next rotation step would cut it off.
	LacksPrimary bool `json:"lacksPrimary,omitempty"`
	// PairSecret is the secret this node's IPsec traffic to it is keyed
	// with; empty while none is (no encrypted network reaches it).
	PairSecret string `json:"pairSecret,omitempty"`
}
