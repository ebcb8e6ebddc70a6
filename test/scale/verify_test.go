package scale

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// verify checks what every host's fake kernel holds: a sandbox for each of
// its networks and no other, in each exactly the other hosts' endpoints of
// that network as neighbours with their MACs, one FDB entry per endpoint
// to its owner's VTEP, and a veth per own endpoint.
func verify(t *testing.T, nodes []*node, l *layout) {
	t.Helper()
	bad := 0
	for _, n := range nodes {
		if errs := verifyHost(n, l); len(errs) > 0 {
			bad++
			if bad <= 5 {
				t.Errorf("%s: %s", nodeName(n.i), strings.Join(errs, "; "))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d hosts do not hold exactly the remote endpoints of their networks", bad, len(nodes))
	}
}

func verifyHost(n *node, l *layout) []string {
	var errs []string
	snap := n.fake.Snapshot()
	for sb := range snap {
		if !slices.ContainsFunc(l.hostNets[n.i], func(k int) bool { return netID(k) == sb }) {
			errs = append(errs, fmt.Sprintf("sandbox %.12s of a network the host is not in", sb))
		}
	}
	for _, k := range l.hostNets[n.i] {
		nid := netID(k)
		sb := snap[nid]
		if sb == nil {
			errs = append(errs, fmt.Sprintf("network %d: no sandbox", k))
			continue
		}
		fdbList, err := n.k.FDB(nid)
		if err != nil {
			errs = append(errs, fmt.Sprintf("network %d: FDB: %v", k, err))
		}
		fdb := map[hwaddr.MAC]netip.Addr{}
		for _, e := range fdbList {
			fdb[e.MAC] = e.VTEP
		}
		own := 0
		for g := k * l.perNet; g < (k+1)*l.perNet && len(errs) <= 5; g++ {
			owner := int(l.owner[g])
			mac, ok := sb.Neighbors[epIP(g)]
			switch {
			case owner == n.i:
				own++
				if ok {
					errs = append(errs, fmt.Sprintf("own endpoint %d has a neighbour entry", g))
				}
			case !ok:
				errs = append(errs, fmt.Sprintf("endpoint %d (of %s) missing", g, nodeName(owner)))
			case mac != epMAC(g):
				errs = append(errs, fmt.Sprintf("endpoint %d has MAC %s, want %s", g, mac, epMAC(g)))
			case fdb[epMAC(g)] != nodeIP(owner):
				errs = append(errs, fmt.Sprintf("endpoint %d: FDB entry to %v, want %v", g, fdb[epMAC(g)], nodeIP(owner)))
			}
		}
		if want := l.perNet - own; len(sb.Neighbors) != want || len(fdbList) != want {
			errs = append(errs, fmt.Sprintf("network %d: %d neighbour and %d FDB entries, want %d", k, len(sb.Neighbors), len(fdbList), want))
		}
		if len(sb.Veths) != own {
			errs = append(errs, fmt.Sprintf("network %d: %d veths, want %d", k, len(sb.Veths), own))
		}
	}
	return errs
}

// lagging describes the hosts that miss endpoints, for a timeout.
func lagging(nodes []*node, tr *tracker) string {
	l := tr.l
	var out []string
	for _, n := range nodes {
		missing := 0
		for _, k := range l.hostNets[n.i] {
			for g := k * l.perNet; g < (k+1)*l.perNet; g++ {
				if int(l.owner[g]) != n.i && tr.progAt[l.slot(n.i, g)].Load() == 0 {
					missing++
				}
			}
		}
		if missing > 0 {
			st := n.c.Stats()
			out = append(out, fmt.Sprintf("%s misses %d (table %d records, %d pending, %d queued)", nodeName(n.i), missing, st.Records, st.Pending, st.BroadcastsQueued))
		}
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("… %d more hosts", len(out)-10))
	}
	return strings.Join(out, "; ")
}

// health summarises the membership views: how many (host, member) pairs
// are not alive, and the pending records and queued broadcasts.
func health(nodes []*node, want int) string {
	var down, pending, queued, maxQ int
	for _, n := range nodes {
		st := n.c.Stats()
		down += want - st.MembersAlive
		pending += st.Pending
		queued += st.BroadcastsQueued
		maxQ = max(maxQ, st.BroadcastsQueued)
	}
	return fmt.Sprintf("%d member views not alive, %d records pending, %d broadcasts queued (max %d)", down, pending, queued, maxQ)
}
