package cluster

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// Restarts. A plugin stopped on purpose (SIGTERM: docker plugin disable,
// upgrade or set) is back within minutes, and its containers kept running
// meanwhile: their endpoints, and the IPsec keys of their host, should
// not go from the other hosts after DeadGrace, which is tuned for failure
// (the traffic of a dead host's endpoints has nowhere to go). So Close
// first tells every alive member that speaks wire version 3 that this
// instance (name and epoch) is restarting, a kindRestart message straight
// to each (memberlist's reliable stream), in parallel and bounded by
// restartAnnounceTimeout in all, and then leaves as before. A member that
// receives it marks that instance as restarting (state.restartAnnounced);
// when it is gone, the sweep keeps its records and node data for
// RestartGrace instead of DeadGrace (state.grace). The mark belongs to the
// instance: an announcement for another epoch than the member's current
// one is ignored, and a new instance (a new epoch in its meta) clears it,
// taking over as after any restart. A node that just dies (a crash, or
// a stop without Close) announces nothing, and its records go after
// DeadGrace. A 0.1.0 member gets no announcement (it would refuse the
// kind) and keeps DeadGrace.

// restartAnnounceTimeout bounds the announcement in Close: sends still
// under way then are ended by the shutdown's stream cancellation.
const restartAnnounceTimeout = time.Second

// announceRestart sends the restart announcement to every alive member
// that speaks version 3 and waits for the sends, at most c.restartTO.
func (c *Cluster) announceRestart() {
	if c.wireHi < kindRestartVersion || c.closed.Load() {
		return
	}
	type target struct {
		node *memberlist.Node
		msg  []byte
	}
	var targets []target
	c.mu.Lock()
	for _, m := range c.st.members {
		if !m.alive || m.name == c.name || !m.addr.IsValid() || m.wireOf() < kindRestartVersion {
			continue
		}
		targets = append(targets, target{
			node: &memberlist.Node{Name: m.name, Addr: m.addr.Addr().AsSlice(), Port: m.addr.Port()},
			msg:  encodeRestart(c.versionForLocked(m.name), c.name, c.epoch),
		})
	}
	c.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	done := make(chan bool, len(targets)) // buffered: a late send never blocks
	for _, t := range targets {
		c.wg.Go(func() {
			err := c.ml.SendReliable(t.node, t.msg)
			if err == nil {
				c.restartsSent.Add(1)
				c.bytesOut.Add(uint64(len(t.msg)))
			} else {
				c.log.Debug("restart announcement not delivered", "member", t.node.Name, "err", err)
			}
			done <- err == nil
		})
	}
	timer := time.NewTimer(c.restartTO)
	defer timer.Stop()
	sent := 0
	for range targets {
		select {
		case ok := <-done:
			if ok {
				sent++
			}
		case <-timer.C:
			c.log.Info("restart announced partly", "why", "the other members keep this node's records for their dead grace",
				"delivered", sent, "members", len(targets), "waited", c.restartTO)
			return
		}
	}
	c.log.Info("restart announced", "why", "the members keep this node's records for their restart grace", "delivered", sent, "members", len(targets))
}

// handleRestart takes a member's restart announcement.
func (c *Cluster) handleRestart(m *message) {
	c.restartsIn.Add(1)
	c.mu.Lock()
	ok := c.st.restartAnnounced(m.from, m.epoch)
	grace := c.st.restartGrace
	c.mu.Unlock()
	if !ok {
		c.log.Debug("restart announcement ignored", "why", "not a member's current instance", "member", m.from, "epoch", m.epoch)
		return
	}
	c.log.Info("member restarting", "why", "its records are kept for the restart grace once it is gone",
		"member", m.from, "epoch", m.epoch, "restartGrace", grace)
}
