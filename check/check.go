// Package check gathers what is wrong on this host and with its peers
// into one report, for `overlay-plugin check`: broken data paths with
// their cause, settings the nodes disagree on, gossip refused and why,
// missing kernel features, networks refused, drift that keeps coming
// back. It is pure: the admin API hands it copies of each part's state.
package check

import (
	"fmt"
	"slices"
	"time"

	"github.com/overlay-plugin/overlay-plugin/health"
)

// Finding is one thing wrong, in words an operator can act on.
type Finding struct {
	// Area groups findings: "data path", "settings", "gossip", "kernel",
	// "encryption", "network", "drift".
	Area string `json:"area"`
	// Subject is what it is about: a peer, a node, a network.
	Subject string `json:"subject,omitempty"`
	Problem string `json:"problem"`
}

// Report is the check's answer. OK is true when there is no finding.
type Report struct {
	OK       bool      `json:"ok"`
	Findings []Finding `json:"findings"`
	// Probing says the data path is probed; Paths are the probes' view.
	Probing bool                `json:"probing"`
	Paths   []health.PathStatus `json:"paths"`
}

// Inputs are the parts' states, copies all.
type Inputs struct {
	Now     time.Time
	Probing bool
	Paths   []health.PathStatus
	// Settings are the disagreements with peers, already in words.
	Settings []Finding
	// Gossip is false when the control plane does not run; Rejections
	// count the gossip refused lately, by reason (controlplane).
	Gossip     bool
	Rejections map[string]uint64
	// SecretConfigured: gossip is authenticated and encrypted networks
	// can be made; ESPUnsupported says why this kernel cannot carry them
	// ("" when it can).
	SecretConfigured bool
	ESPUnsupported   string
	// NFTables says why nf_tables cannot be used ("" when it can).
	NFTables string
	// EncryptionError is the encryption manager's last failure.
	EncryptionError string
	// Refused are the networks this host refused to Docker, by id.
	Refused map[string]string
	// RepairPasses and LastRepair: the reconciler's passes that
	// repaired drift, and the last one's time.
	RepairPasses uint64
	LastRepair   time.Time
}

// recurring: this many repairing passes, the last this recent, are
// drift that keeps coming back rather than one accident.
const (
	recurringPasses = 3
	recurringWithin = 10 * time.Minute
)

// rejectionWhy says what a refusal reason means for the operator.
var rejectionWhy = map[string]string{
	"decrypt":         "gossip that does not decrypt with this node's secret arrives: a node runs with another cluster secret",
	"plain":           "unencrypted gossip arrives while this node has a secret: a node runs without --secret-file",
	"wire_version":    "a node speaks no gossip wire version this node does: it runs a release too old or too new to mix with this one",
	"vtep":            "records whose VTEP is not their owner's address arrive: a node advertises another address than it gossips from (check --advertise-addr)",
	"foreign_owner":   "records for endpoints owned by another node arrive: two nodes share a node name or an endpoint",
	"unknown_type":    "gossip messages of an unknown type arrive: a node runs a newer release that this one cannot read, or something that is no node talks to the gossip port",
	"decode":          "malformed gossip arrives on the gossip port",
	"compressed":      "compressed gossip arrives, which this node refuses",
	"misdirected":     "gossip meant for another node arrives",
	"queue_full":      "gossip is dropped because this node falls behind",
	"not_member":      "records of nodes gone past the dead grace arrive",
	"stream_idle":     "connections to the gossip port send nothing, or too little, in time: a scanner, a load balancer's health check, or a node stalled",
	"stream_limit":    "more connections to the gossip port wait at once than a cluster makes: someone holds connections open",
	"unknown_reasons": "gossip is refused",
}

// Build turns the inputs into a report.
func Build(in Inputs) Report {
	r := Report{Probing: in.Probing, Paths: in.Paths, Findings: []Finding{}}
	add := func(area, subject, format string, args ...any) {
		r.Findings = append(r.Findings, Finding{Area: area, Subject: subject, Problem: fmt.Sprintf(format, args...)})
	}
	if !in.Probing {
		add("data path", "", "the data path is not probed (--probe-interval 0, or its endpoints could not be built: see the log): blocked VXLAN, ESP or MTU would go unnoticed")
	}
	for _, p := range in.Paths {
		if p.Broken() {
			add("data path", p.Peer.String(), "%s (%s path, since %s)", p.Problem, p.Path, p.Since.UTC().Format(time.RFC3339))
		}
	}
	r.Findings = append(r.Findings, in.Settings...)
	if in.Gossip {
		for _, reason := range sortedKeys(in.Rejections) {
			why := rejectionWhy[reason]
			if why == "" {
				why = rejectionWhy["unknown_reasons"]
			}
			add("gossip", "", "%s (%d refused in the last minute, reason %s)", why, in.Rejections[reason], reason)
		}
		if !in.SecretConfigured {
			add("encryption", "", "gossip is neither encrypted nor authenticated and encrypted networks cannot be made: give every node the same 32-byte secret (--secret-file)")
		}
	}
	if in.SecretConfigured && in.ESPUnsupported != "" {
		add("kernel", "", "encrypted networks cannot work on this host: %s", in.ESPUnsupported)
	}
	if in.NFTables != "" {
		add("kernel", "", "service VIPs and encrypted networks need nf_tables, which this host does not serve: %s", in.NFTables)
	}
	if in.EncryptionError != "" {
		add("encryption", "", "the last IPsec change failed: %s", in.EncryptionError)
	}
	for _, id := range sortedKeys(in.Refused) {
		add("network", id, "refused to Docker, its tasks fail on this host: %s", in.Refused[id])
	}
	if in.RepairPasses >= recurringPasses && in.Now.Sub(in.LastRepair) < recurringWithin {
		add("drift", "", "the reconciler repaired the overlay's kernel state %d times since start, the last %s ago: something on this host keeps changing it (another network tool, a cleanup script)",
			in.RepairPasses, in.Now.Sub(in.LastRepair).Round(time.Second))
	}
	r.OK = len(r.Findings) == 0
	return r
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
