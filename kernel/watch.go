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
)

// watchBuffer is the receive buffer of a watch socket. A burst of peer
// programming makes two messages per peer; a reader that falls behind
// anyway gets ENOBUFS, reported as EventLost.
const watchBuffer = 2 << 20

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
	ch := make(chan Event, 1024)
	go func() {
		defer close(ch)
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		defer c.Close()
		send := func(e Event) bool {
			select {
			case ch <- e:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for {
			msgs, err := c.Receive()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				// ENOBUFS: the socket overflowed, it still works.
				if !send(Event{Kind: EventLost}) || !errors.Is(err, unix.ENOBUFS) {
					return
				}
				continue
			}
			for _, m := range msgs {
				e, ok := parseEvent(uint16(m.Header.Type), m.Data, &vxIndex)
				if ok && !send(e) {
					return
				}
			}
		}
	}()
	return ch, nil
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
		nb, err := netlink.NeighDeserialize(data)
		if err != nil {
			return Event{}, false
		}
		del := typ == unix.RTM_DELNEIGH
		if nb.Family == unix.AF_BRIDGE {
			e, ok := fdbOf(nb, *vxIndex)
			return Event{Kind: EventFDB, Deleted: del, FDB: e}, ok
		}
		e, ok := neighborOf(nb, *vxIndex, del)
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
