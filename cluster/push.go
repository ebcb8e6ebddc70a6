package cluster

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// Pushes. An owner sends its endpoint records straight to every alive
// member of their network, over memberlist's reliable channel (a TCP
// stream, encrypted and authenticated like all gossip). Nothing is
// relayed, and nothing queues behind failure detection: memberlist
// handles a stream's message on the stream's own goroutine, while its
// UDP messages share one handler queue with suspicions and alive
// messages, which a burst of records overflowed ("handler queue full").
//
// Each member has an outbox: the keys of this node's records it is due,
// and anti-entropy messages. At most one send per member is under way;
// what accumulates meanwhile goes in the next message, so batches grow
// with the load and a slow member delays only itself. Records whose send
// failed go back in the outbox and are sent again pushRetry later, for
// as long as the member is alive: anti-entropy leaves what an owner is
// pushing to the owner (shipment.go). A failed anti-entropy message is
// dropped: the next round sends a fresh one.
const (
	// pushDelay gathers the changes of a burst (a task start is several
	// Publish calls) into one message per member.
	pushDelay = 5 * time.Millisecond
	// pushWorkers bounds the sends under way; each waits at most
	// memberlist's TCPTimeout for an unreachable member.
	pushWorkers = 16
	// maxPushBatch bounds the records of one message.
	maxPushBatch = 4096
	// maxQueuedSyncs bounds the anti-entropy messages waiting for one
	// member; older ones are dropped (the next round sends fresh ones).
	maxQueuedSyncs = 4
	// pushRetry is the wait before records whose send failed are sent
	// again.
	pushRetry = time.Second
)

type outboxState int

const (
	obIdle    outboxState = iota
	obWaiting             // in c.waiting, until the pushDelay timer fires
	obReady               // in c.ready, for a worker
	obSending             // a worker sends its contents
)

// outbox is what waits to be sent to one member. Guarded by Cluster.mu.
type outbox struct {
	name    string
	keys    map[key]struct{} // this node's records due to the member: sent as they are at send time
	sending map[key]struct{} // the keys of the send under way (obSending)
	syncs   [][]byte         // encoded anti-entropy messages
	state   outboxState
}

// flushLocked moves what the state queued into the broadcast queue (new
// memberships) and the outboxes (this node's changed records, and all of
// its records of a network to a node new in it), and wakes the delivery
// goroutine if the table changed. Caller holds c.mu; the queue's lock is
// a leaf below it.
func (c *Cluster) flushLocked() {
	now := c.clock()
	for _, r := range c.st.out {
		c.queue.QueueBroadcast(&broadcast{
			name: r.NetworkID + "\x00" + r.EndpointID,
			msg:  encodeRecordsAt(c.bcastVer, kindRecords, []*record{r}, now),
		})
	}
	clear(c.st.out)
	c.st.out = c.st.out[:0]
	if c.queue.NumQueued() > maxBroadcastQueue {
		c.queue.Prune(maxBroadcastQueue)
	}

	if len(c.st.push) > 0 {
		members := map[string][]*member{}
		for _, k := range c.st.push {
			ms, ok := members[k.nid]
			if isMemberEID(k.eid) {
				// This node joined or left the network: everyone keeps
				// memberships, and a member that learns of a new one at
				// once pushes it its records, so every node is told at
				// once. It happens once per network and node, in one
				// message per node with whatever else is due to it.
				ms = c.st.aliveMembers()
			} else if !ok {
				ms = c.st.networkMembers(k.nid)
				members[k.nid] = ms
			}
			for _, m := range ms {
				if m.alive {
					c.pushLocked(m.name, k)
				}
			}
		}
		c.st.push = c.st.push[:0]
	}
	for _, j := range c.st.joins {
		for k := range c.st.own {
			if k.nid == j.nid && !isMemberEID(k.eid) {
				c.pushLocked(j.node, k)
			}
		}
	}
	clear(c.st.joins)
	c.st.joins = c.st.joins[:0]

	if c.st.hasDirty() {
		c.wake(c.deliverCh)
	}
}

func (c *Cluster) outboxLocked(name string) *outbox {
	ob := c.outboxes[name]
	if ob == nil {
		ob = &outbox{name: name, keys: map[key]struct{}{}}
		c.outboxes[name] = ob
	}
	return ob
}

// detachLocked gives member name a fresh outbox if a send to it is under
// way: one that came back must not wait behind a send that started while
// it was unreachable (a dial into a partition that drops packets waits
// out memberlist's TCPTimeout, 10 s). The old send finishes or fails on
// its own; what both carry is applied newest-wins, in any order.
func (c *Cluster) detachLocked(name string) {
	if ob := c.outboxes[name]; ob != nil && ob.state == obSending {
		delete(c.outboxes, name)
	}
}

// queuedFor returns whether one of this node's records is on its way to
// member name: queued, or in the send under way. Called, and its result
// used, with c.mu held.
func (c *Cluster) queuedFor(name string) func(key) bool {
	ob := c.outboxes[name]
	if ob == nil {
		return nil
	}
	return func(k key) bool {
		_, queued := ob.keys[k]
		_, sending := ob.sending[k]
		return queued || sending
	}
}

// pushLocked queues this node's record k for member name.
func (c *Cluster) pushLocked(name string, k key) {
	if name == c.name {
		return
	}
	ob := c.outboxLocked(name)
	ob.keys[k] = struct{}{}
	c.scheduleLocked(ob)
}

// sendLocked queues an anti-entropy message for member name.
func (c *Cluster) sendLocked(name string, msg []byte) {
	if name == c.name || c.st.members[name] == nil {
		return
	}
	ob := c.outboxLocked(name)
	if len(ob.syncs) >= maxQueuedSyncs {
		ob.syncs = slices.Delete(ob.syncs, 0, 1)
		c.pushDropped++
	}
	ob.syncs = append(ob.syncs, msg)
	c.scheduleLocked(ob)
}

// scheduleLocked makes an idle outbox due after pushDelay.
func (c *Cluster) scheduleLocked(ob *outbox) {
	if ob.state != obIdle {
		return
	}
	ob.state = obWaiting
	c.waiting = append(c.waiting, ob)
	if !c.flushArmed {
		c.flushArmed = true
		time.AfterFunc(pushDelay, c.releaseWaiting)
	}
}

// releaseWaiting hands the outboxes gathered over pushDelay to the workers.
func (c *Cluster) releaseWaiting() {
	c.mu.Lock()
	for _, ob := range c.waiting {
		ob.state = obReady
		c.ready = append(c.ready, ob)
	}
	clear(c.waiting)
	c.waiting = c.waiting[:0]
	c.flushArmed = false
	c.pushCond.Broadcast()
	c.mu.Unlock()
}

// pushWorker sends ready outboxes until Close.
func (c *Cluster) pushWorker() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		for len(c.ready) == 0 && !c.closed.Load() {
			c.pushCond.Wait()
		}
		if c.closed.Load() {
			c.mu.Unlock()
			return
		}
		ob := c.ready[0]
		c.ready = slices.Delete(c.ready, 0, 1)
		node, syncs, recs := c.takeLocked(ob)
		v := c.versionForLocked(ob.name)
		c.mu.Unlock()

		var sent, failed int
		recsFailed := false
		if node != nil {
			msgs := syncs
			if len(recs) > 0 {
				msgs = append(msgs, encodeRecordsAt(v, kindPush, recs, c.clock()))
			}
			for i, msg := range msgs {
				if err := c.sendDirect(node, msg); err != nil {
					failed++
					recsFailed = recsFailed || len(recs) > 0 && i == len(msgs)-1
					c.log.Debug("push failed", "member", ob.name, "err", err)
					continue
				}
				sent++
				c.bytesOut.Add(uint64(len(msg)))
			}
		}

		c.mu.Lock()
		c.pushesSent += uint64(sent)
		c.pushErrors += uint64(failed)
		if recsFailed {
			maps.Copy(ob.keys, ob.sending)
		}
		clear(ob.sending)
		switch {
		case recsFailed:
			ob.state = obIdle
			time.AfterFunc(pushRetry, func() { c.retryPush(ob) })
		case len(ob.keys) > 0 || len(ob.syncs) > 0:
			ob.state = obReady
			c.ready = append(c.ready, ob)
			c.pushCond.Signal()
		default:
			ob.state = obIdle
			if c.outboxes[ob.name] == ob {
				delete(c.outboxes, ob.name)
			}
		}
		c.mu.Unlock()
	}
}

// retryPush sends again what a failed send left in ob, unless something
// sent it meanwhile or ob was replaced (detachLocked) or dropped.
func (c *Cluster) retryPush(ob *outbox) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() || c.outboxes[ob.name] != ob || len(ob.keys) == 0 {
		return
	}
	c.scheduleLocked(ob)
}

// takeLocked empties up to maxPushBatch keys and every anti-entropy
// message out of ob, with the records as they are now, grouped by
// network. A member that is gone gets nothing: its outbox is dropped.
func (c *Cluster) takeLocked(ob *outbox) (*memberlist.Node, [][]byte, []*record) {
	ob.state = obSending
	m := c.st.members[ob.name]
	if m == nil || !m.alive || !m.addr.IsValid() {
		c.pushDropped += uint64(len(ob.keys) + len(ob.syncs))
		clear(ob.keys)
		ob.syncs = nil
		return nil, nil, nil
	}
	var recs []*record
	if ob.sending == nil {
		ob.sending = map[key]struct{}{}
	}
	for k := range ob.keys {
		if len(recs) == maxPushBatch {
			break
		}
		delete(ob.keys, k)
		if r := c.st.get(k); r != nil && r.Owner == c.name {
			recs = append(recs, r)
			ob.sending[k] = struct{}{}
		}
	}
	slices.SortFunc(recs, func(a, b *record) int { return cmp.Compare(a.NetworkID, b.NetworkID) })
	syncs := ob.syncs
	ob.syncs = nil
	node := &memberlist.Node{Name: m.name, Addr: m.addr.Addr().AsSlice(), Port: m.addr.Port()}
	return node, syncs, recs
}
