package kernel

// Change events of a sandbox, for the driver's reconciler.

import (
	"context"
	"errors"
	"fmt"
	"net"

	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// watchBuffer is the receive buffer of a watch socket, a bound that
// costs nothing until a burst fills it. A burst of peer programming makes
// two messages per peer, each about a KiB of it, in the time of one
// sendmsg (Program); with 2 MiB a 50,000-peer burst overflowed it several
// times on a loaded 2-core machine, and every overflow is an EventLost:
// a full comparison, under the network's lock, in the middle of the
// burst. A reader that falls behind anyway gets ENOBUFS, reported as
// EventLost.
const watchBuffer = 32 << 20

// Watch implements Kernel: one rtnetlink socket in the sandbox namespace,
// in the link and neighbour groups (the latter carries the VXLAN FDB too).
func (n *Netlink) Watch(ctx context.Context, name string) (<-chan Event, error) {
	sb, err := n.sandbox(name)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	defer n.release(sb)
	c, err := mdnetlink.Dial(unix.NETLINK_ROUTE, &mdnetlink.Config{NetNS: sb.fd})
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %q: %w", name, err)
	}
	if err := subscribe(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("watch sandbox %q: %w", name, err)
	}
	// Looked up after subscribing, so a device made in between is seen
	// by one or the other.
	vxIndex := 0
	if l, err := sb.h.LinkByName(VXLANName); err == nil {
		vxIndex = l.Attrs().Index
	}
	// Our own programming's echoes agree with the driver by construction;
	// neighbour events carry the socket that made the change, so the
	// kernel drops those of the Program socket. The VXLAN FDB's events
	// carry none: those Program expects are dropped here (echoes.go).
	rc, err := c.SyscallConn()
	if err == nil {
		err = dropPortID(rc, sb.pipe.portid)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("watch sandbox %q: %w", name, err)
	}
	r := newBatchReader(rc)
	echoes := &sb.pipe.echoes
	q := newEventQueue(ctx)
	go func() {
		defer q.close()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		defer c.Close()
		each := func(dgram []byte, truncated bool) {
			if truncated {
				q.lost()
				return
			}
			for m := range messages(dgram) {
				e, ok := parseEvent(m.typ, m.data, &vxIndex)
				if ok && !(e.Kind == EventFDB && echoes.seen(vxIndex, &e.FDB, e.Deleted)) {
					q.push(e)
				}
			}
		}
		for {
			err := r.read(each)
			if ctx.Err() != nil {
				return
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				// ENOBUFS: the socket overflowed, it still works.
				q.lost()
				if !errors.Is(err, unix.ENOBUFS) {
					return
				}
			}
		}
	}()
	return q.out, nil
}

// watchQueue bounds the events a Watch holds for a slow reader; beyond
// it they are dropped and an EventLost stands for them.
const watchQueue = 1 << 16

// eventQueue decouples the socket from Watch's reader: the socket is
// drained at once whatever the reader does (a reader waiting for a lock
// while a burst is programmed would otherwise overflow it and cost a
// full comparison), and out delivers in order.
type eventQueue struct {
	// mu guards q, dropped and closed. A leaf; wake is signalled after
	// it is released.
	mu      lockrank.Mutex[lockrank.EventQueue]
	q       []Event
	dropped bool
	closed  bool
	wake    chan struct{}
	out     chan Event
}

func newEventQueue(ctx context.Context) *eventQueue {
	eq := &eventQueue{wake: make(chan struct{}, 1), out: make(chan Event, 1024)}
	go eq.forward(ctx)
	return eq
}

func (eq *eventQueue) push(e Event) {
	eq.mu.Lock()
	if len(eq.q) < watchQueue {
		eq.q = append(eq.q, e)
	} else {
		eq.dropped = true
	}
	eq.mu.Unlock()
	eq.signal()
}

func (eq *eventQueue) lost() {
	eq.mu.Lock()
	eq.dropped = true
	eq.mu.Unlock()
	eq.signal()
}

func (eq *eventQueue) close() {
	eq.mu.Lock()
	eq.closed = true
	eq.mu.Unlock()
	eq.signal()
}

func (eq *eventQueue) signal() {
	select {
	case eq.wake <- struct{}{}:
	default:
	}
}

// forward moves queued events to out until ctx ends or the queue is
// closed and empty, then closes out; a drop becomes one EventLost after
// the events before it.
func (eq *eventQueue) forward(ctx context.Context) {
	defer close(eq.out)
	var batch []Event
	for {
		select {
		case <-eq.wake:
		case <-ctx.Done():
			return
		}
		eq.mu.Lock()
		batch, eq.q = eq.q, batch[:0]
		dropped, closed := eq.dropped, eq.closed
		eq.dropped = false
		eq.mu.Unlock()
		if dropped {
			batch = append(batch, Event{Kind: EventLost})
		}
		for _, e := range batch {
			select {
			case eq.out <- e:
			case <-ctx.Done():
				return
			}
		}
		if closed {
			eq.mu.Lock()
			empty := len(eq.q) == 0 && !eq.dropped
			eq.mu.Unlock()
			if empty {
				return
			}
			eq.signal()
		}
	}
}

func subscribe(c *mdnetlink.Conn) error {
	for _, g := range []uint32{unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH} {
		if err := c.JoinGroup(g); err != nil {
			return fmt.Errorf("join netlink group %d: %w", g, err)
		}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// FORCE passes rmem_max; we have CAP_NET_ADMIN. Failing that,
		// the default buffer works, with more EventLost.
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, watchBuffer)
	}); err != nil {
		return err
	}
	if serr != nil {
		return c.SetReadBuffer(watchBuffer)
	}
	return nil
}

// parseEvent turns one rtnetlink message into an Event about the sandbox's
// devices or its VXLAN device's entries; ok is false for anything else.
// vxIndex is the VXLAN device's ifindex (0: none), kept up to date from
// the link messages.
func parseEvent(typ uint16, data []byte, vxIndex *int) (_ Event, ok bool) {
	switch typ {
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		if *vxIndex == 0 {
			return Event{}, false // the device's own events say it all
		}
		m, ok := parseNeighMsg(data)
		if !ok {
			return Event{}, false
		}
		del := typ == unix.RTM_DELNEIGH
		if m.family == unix.AF_BRIDGE {
			e, ok := m.fdb(*vxIndex)
			return Event{Kind: EventFDB, Deleted: del, FDB: e}, ok
		}
		e, ok := m.neighbor(*vxIndex, del)
		return Event{Kind: EventNeighbor, Deleted: del, Neighbor: e}, ok
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		l, err := netlink.LinkDeserialize(nil, data)
		if err != nil {
			return Event{}, false
		}
		a := l.Attrs()
		// A DELLINK of family AF_BRIDGE only takes a port off the bridge.
		gone := typ == unix.RTM_DELLINK && !isBridgePortMsg(data)
		switch {
		case a.Name == VXLANName:
			switch {
			case gone:
				*vxIndex = 0
			case typ == unix.RTM_NEWLINK:
				*vxIndex = a.Index
			}
			return Event{Kind: EventDevice, Device: VXLANName, Deleted: gone,
				Broken: typ == unix.RTM_DELLINK || a.Flags&net.FlagUp == 0 || a.MasterIndex == 0}, true
		case a.Index == *vxIndex && a.Index != 0:
			*vxIndex = 0 // renamed: VXLANName is missing now
			return Event{Kind: EventDevice, Device: VXLANName, Broken: true}, true
		case a.Name == BridgeName:
			return Event{Kind: EventDevice, Device: BridgeName, Deleted: gone,
				Broken: typ == unix.RTM_DELLINK || a.Flags&net.FlagUp == 0}, true
		}
	}
	return Event{}, false
}

// isBridgePortMsg reports a link message of family AF_BRIDGE (about a
// bridge port, not the device itself).
func isBridgePortMsg(data []byte) bool { return len(data) > 0 && data[0] == unix.AF_BRIDGE }
