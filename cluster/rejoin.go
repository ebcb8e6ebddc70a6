package cluster

import (
	"context"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Rejoining: the addresses this node (re)joins when they are not alive
// members (seeds, Docker's hints, former members), and when.

const (
	// joinParallelism bounds concurrent join attempts of one rejoin round.
	joinParallelism = 4
	// candidateTTL: how long an address seen as a member (but neither a seed
	// nor a Docker hint) stays a rejoin candidate after it was last alive.
	candidateTTL = time.Hour
)

type candidateKind int

const (
	candSeed candidateKind = 1 << iota
	candHint
	candSeen
)

// candidate is an address to (re)join when it is not an alive member.
type candidate struct {
	kinds     candidateKind
	lastAlive time.Time
}

// NodeHint passes on Docker's word that a swarm node exists at addr: it is
// joined at addr:gossip-port in the background and kept as a rejoin
// candidate (until ForgetNode).
func (c *Cluster) NodeHint(addr netip.Addr) {
	if !addr.IsValid() || addr.IsUnspecified() {
		return
	}
	a := netip.AddrPortFrom(addr.Unmap(), uint16(c.port)).String()
	if a == c.selfAddr {
		return
	}
	c.mu.Lock()
	cand := c.cands[a]
	if cand == nil {
		cand = &candidate{}
		c.cands[a] = cand
	}
	cand.kinds |= candHint
	c.mu.Unlock()
	c.wake(c.joinCh)
}

// ForgetNode drops a node Docker removed from the swarm (DiscoverDelete):
// its address is no longer re-joined once it stops being a member, neither
// as a hint nor as a former member (which would be retried for
// candidateTTL); a configured seed stays. Membership itself is unaffected.
func (c *Cluster) ForgetNode(addr netip.Addr) {
	a := netip.AddrPortFrom(addr.Unmap(), uint16(c.port)).String()
	c.mu.Lock()
	if cand := c.cands[a]; cand != nil {
		cand.kinds &^= candHint | candSeen
		if cand.kinds == 0 {
			delete(c.cands, a)
		}
	}
	c.mu.Unlock()
}

// pruneCandidatesLocked forgets former members' addresses that have not
// been alive for candidateTTL; seeds and hints stay. Caller holds c.mu.
func (c *Cluster) pruneCandidatesLocked() {
	now := c.clock()
	for _, m := range c.st.members {
		if m.alive && m.addr.IsValid() {
			if cand := c.cands[m.addr.String()]; cand != nil {
				cand.lastAlive = now
			}
		}
	}
	for a, cand := range c.cands {
		if cand.kinds == candSeen && now.Sub(cand.lastAlive) > candidateTTL {
			delete(c.cands, a)
		}
	}
}

// rejoinLoop joins the seeds at once, then every RejoinInterval (or on a
// hint) re-joins every candidate address that is not an alive member.
func (c *Cluster) rejoinLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.rejoin)
	defer t.Stop()
	for {
		c.rejoinRound()
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.joinCh:
		}
	}
}

// reconnectLoop brings back gone members as soon as they can be reached
// again, and syncs with each member that came back.
//
// Nothing else would, quickly: memberlist neither probes nor gossips to a
// dead member (past GossipToTheDeadTime it forgets it), so after a
// partition longer than that each side hears of the other only when a
// join crosses the cut. The rejoin round does one every RejoinInterval
// (10 s) per node, and into a partition that drops packets its dials hang
// for memberlist's TCPTimeout (10 s) meanwhile: a healed partition waited
// up to about 10 s (6.2 s measured on three hosts) for the first contact.
// So every ProbeInterval (1 s) a few former members that are gone are
// pinged (UDP, one small packet each, waiting at most ProbeTimeout), and
// those that answer are joined at once: contact within about a second of
// the heal, and the same push/pull that makes both sides alive again
// carries the memberships of their networks. Seeds and Docker's hints of
// nodes never seen stay with the rejoin round: such an address need not
// be the gossip address the node advertises, so answering pings would not
// make it an alive member, and it would be joined every second.
func (c *Cluster) reconnectLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.probeInt)
	defer t.Stop()
	for {
		c.syncComebacks()
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.probeGone()
		case <-c.backCh:
		}
	}
}

// probeGone pings up to joinParallelism random former members that are
// gone, at once, and joins each one that answers.
func (c *Cluster) probeGone() {
	targets := c.goneCandidates()
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	var wg sync.WaitGroup
	for _, a := range targets[:min(len(targets), joinParallelism)] {
		wg.Go(func() {
			// No node name: whichever node answers at the address is
			// joined (a restarted one may have another name).
			if _, err := c.ml.Ping("", net.UDPAddrFromAddrPort(a)); err != nil {
				return
			}
			select {
			case <-c.stop: // a join now would undo the graceful leave
				return
			default:
			}
			if _, err := c.ml.Join([]string{a.String()}); err != nil {
				c.log.Debug("join after an answered ping failed", "addr", a, "err", err)
				return
			}
			c.log.Info("reconnected", "addr", a)
		})
	}
	wg.Wait()
}

// goneCandidates lists the gossip addresses of former members (seen as
// members within candidateTTL) that are not alive members, and that no
// node is named after.
//
// memberlist's Ping of an address without a node name looks the address's
// host up as a node name, and reads that node's protocol versions after
// releasing its lock (memberlist v0.7.0 net.go rawSendMsgPacket), racing
// with the alive message that updates them: exactly when a node named by
// its IP comes back. Such a node is left to the rejoin round.
func (c *Cluster) goneCandidates() []netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	alive := map[netip.AddrPort]bool{}
	for _, m := range c.st.members {
		if m.alive {
			alive[m.addr] = true
		}
	}
	var out []netip.AddrPort
	for s, cand := range c.cands {
		if cand.kinds&candSeen == 0 {
			continue
		}
		a, err := netip.ParseAddrPort(s)
		if err != nil || alive[a] || s == c.selfAddr || c.st.members[a.Addr().String()] != nil {
			continue
		}
		out = append(out, a)
	}
	return out
}

// syncComebacks does a push/pull and a digest exchange with each member
// that came back from gone. The push/pull that healed the partition may
// have run while the member was still gone here (memberlist marks it
// alive only after it refutes), or this node heard of its return by
// gossip; either way what the member sent meanwhile was refused as coming
// from a node gone past the grace. The push/pull runs with the member
// alive and takes its memberships (so each side pushes the other its
// records of their networks); the digest exchange then takes the records
// the member pushed while it was still gone here, at once rather than at
// a later round's random pick.
func (c *Cluster) syncComebacks() {
	c.mu.Lock()
	addrs := slices.Collect(maps.Keys(c.comebacks))
	clear(c.comebacks)
	c.mu.Unlock()
	if len(addrs) == 0 {
		return
	}
	if n, err := c.ml.Join(addrs); err != nil {
		c.log.Debug("push/pull with members that came back", "reached", n, "of", len(addrs), "err", err)
	}
	c.syncAt(addrs)
}

// rejoinRound tries the candidates that are not alive members, in random
// order and joinParallelism at a time, and stops after the first batch
// with a success: one push/pull with a node of another partition merges
// the memberships (the rest follows by gossip and refutation), and nodes
// that stay unreachable are tried again next round. Each attempt is
// bounded by memberlist's TCPTimeout, and so is a Close during a round.
func (c *Cluster) rejoinRound() {
	c.mu.Lock()
	alive := map[string]bool{}
	for _, m := range c.st.members {
		if m.alive && m.addr.IsValid() {
			alive[m.addr.String()] = true
		}
	}
	var targets []string
	for a := range c.cands {
		if !alive[a] && a != c.selfAddr {
			targets = append(targets, a)
		}
	}
	c.mu.Unlock()
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })

	for len(targets) > 0 {
		var (
			wg     sync.WaitGroup
			joined atomic.Bool
		)
		for n := 0; n < joinParallelism && len(targets) > 0; {
			a := targets[0]
			targets = targets[1:]
			if host, _, err := net.SplitHostPort(a); err == nil {
				if _, err := netip.ParseAddr(host); err != nil && c.resolvesToAlive(a, alive) {
					continue // a DNS seed whose addresses are members already
				}
			}
			n++
			wg.Go(func() {
				if k, err := c.ml.Join([]string{a}); err != nil || k == 0 {
					c.log.Debug("join attempt failed", "addr", a, "err", err)
				} else {
					joined.Store(true)
					c.log.Info("joined", "addr", a)
				}
			})
		}
		wg.Wait()
		if joined.Load() {
			return
		}
		select {
		case <-c.stop:
			return
		default:
		}
	}
}

func (c *Cluster) resolvesToAlive(hostport string, alive map[string]bool) bool {
	host, port, _ := net.SplitHostPort(hostport)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if alive[net.JoinHostPort(ip.Unmap().String(), port)] {
			return true
		}
	}
	return false
}
