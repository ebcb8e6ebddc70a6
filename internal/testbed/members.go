package testbed

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// Member is one gossip member as GET /v1/cluster lists it.
type Member struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	VTEP  string `json:"vtep"`
	State string `json:"state"`
	Self  bool   `json:"self"`
	// Wire is the range of wire versions it speaks ("2..3"); KeptUntil,
	// for a gone member, when its records go. Empty from releases
	// before they were listed (0.1.0).
	Wire      string    `json:"wire"`
	KeptUntil time.Time `json:"keptUntil"`
}

// ClusterView is GET /v1/cluster: the members a plugin knows, and its
// gossip statistics.
type ClusterView struct {
	Members []Member       `json:"members"`
	Stats   map[string]any `json:"stats"`
}

// ClusterView reads n's /v1/cluster.
func (n *Node) ClusterView() (ClusterView, error) {
	var v ClusterView
	err := n.Plugin.AdminJSON("/v1/cluster", &v)
	return v, err
}

// MemberState is the state n reports for member name ("" if it does not
// list it).
func (n *Node) MemberState(name string) (string, error) {
	v, err := n.ClusterView()
	if err != nil {
		return "", err
	}
	for _, m := range v.Members {
		if m.Name == name {
			return m.State, nil
		}
	}
	return "", nil
}

// Sees says whether obs should list m alive; nil: whenever m's plugin
// runs.
type Sees func(obs, m *Node) bool

// MemberDiffs: every host whose plugin runs lists exactly itself (as
// self) and the hosts it sees as alive, with their VTEPs.
func (c *Cluster) MemberDiffs(sees Sees) []string {
	if sees == nil {
		sees = func(_, m *Node) bool { return m.Plugin.Running() }
	}
	var out []string
	for _, n := range c.Nodes {
		if !n.Plugin.Running() {
			continue
		}
		v, err := n.ClusterView()
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", n.Name, err))
			continue
		}
		want := map[string]string{}
		for _, m := range c.Nodes {
			if m == n || sees(n, m) {
				want[m.Name] = m.Underlay.String()
			}
		}
		got := map[string]string{}
		for _, m := range v.Members {
			if m.State == "alive" {
				got[m.Name] = m.VTEP
			}
			if m.Self != (m.Name == n.Name) {
				out = append(out, fmt.Sprintf("%s: member %s has self=%v", n.Name, m.Name, m.Self))
			}
		}
		if !maps.Equal(got, want) {
			out = append(out, fmt.Sprintf("%s: alive members (name->vtep) %v, want %v", n.Name, got, want))
		}
	}
	return out
}

// WaitMembers waits up to timeout until MemberDiffs finds nothing.
func (c *Cluster) WaitMembers(sees Sees, timeout time.Duration, what string) error {
	start := time.Now()
	err := wait.Until(timeout, Poll, func() error {
		if d := c.MemberDiffs(sees); len(d) > 0 {
			return errors.New(strings.Join(d, "\n  "))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: membership not as expected: %w", what, err)
	}
	c.Bed.Logf("%s: membership as expected after %v", what, time.Since(start).Round(time.Millisecond))
	return nil
}
