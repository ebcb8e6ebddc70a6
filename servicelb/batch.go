package servicelb

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A batch is marshalled by google/nftables and sent by us. google/nftables
// asks the kernel to acknowledge every message of a batch and reads each
// acknowledgement with a system call of its own: for a table of 1,000
// services, some 9,000 of them, most of a Join's time. The kernel reports
// a message's failure whether or not it was asked to acknowledge it, so a
// batch needs one acknowledgement only, of its last message: an error
// read before it means the kernel refused the batch (and applied none of
// it), the acknowledgement that it committed.
type batch struct {
	c    *nftables.Conn // queues and marshals; sends nothing
	msgs []netlink.Message
}

// newBatch returns an empty batch; queue on b.c, then send.
func newBatch() (*batch, error) {
	b := &batch{}
	c, err := nftables.New(nftables.WithTestDial(b.capture))
	if err != nil {
		return nil, err
	}
	b.c = c
	return b, nil
}

// capture stands for the kernel while google/nftables flushes: it keeps
// the batch, and acknowledges each message (a nil request is the read of
// an acknowledgement).
func (b *batch) capture(req []netlink.Message) ([]netlink.Message, error) {
	if req != nil {
		b.msgs = append(b.msgs, req...)
		return nil, nil
	}
	return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}, nil
}

var _ nltest.Func = (*batch)(nil).capture

// send sends the queued batch to the kernel of ns in one sendmsg, through
// a socket whose buffers hold send and recv bytes, and waits for the
// verdict. A batch of nothing sends nothing.
func (b *batch) send(ns netns.NsHandle, send, recv int) error {
	if err := b.c.Flush(); err != nil {
		return fmt.Errorf("marshal batch: %w", err)
	}
	msgs := b.msgs
	b.msgs = nil
	if len(msgs) <= 2 { // begin and end only
		return nil
	}
	last := len(msgs) - 2 // the last before the batch's end
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		return fmt.Errorf("netfilter socket: %w", err)
	}
	defer conn.Close()
	if err := sizeBuffers(conn, send, recv); err != nil {
		return err
	}
	if err := sendRaw(conn, marshalBatch(msgs, last)); err != nil {
		return fmt.Errorf("send batch: %w", err)
	}
	for {
		// Receive returns a message's failure as an error.
		replies, err := conn.Receive()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if r.Header.Sequence == uint32(last+1) {
				return nil
			}
		}
	}
}

// marshalBatch lays msgs out in one buffer, numbered from 1, only the
// message at ack asking for an acknowledgement and none for an echo:
// google/nftables asks the kernel to echo every rule it creates (to learn
// its handle, which we never use), and for a 1,000-service table the
// kernel then formatted, and we read, 4,000 rules back. netlink.Conn's own
// SendMessages marshals each message into a slice of its own and appends
// them to a growing buffer: for a 1,000-service table (13,000 messages,
// 2 MB) a third of a Join's CPU went to that copying and its garbage.
func marshalBatch(msgs []netlink.Message, ack int) []byte {
	size := 0
	for _, m := range msgs {
		size += nlAlign(unix.NLMSG_HDRLEN + len(m.Data))
	}
	buf := make([]byte, size)
	at := 0
	for i, m := range msgs {
		n := nlAlign(unix.NLMSG_HDRLEN + len(m.Data))
		flags := m.Header.Flags &^ (netlink.Acknowledge | netlink.Echo)
		if i == ack {
			flags |= netlink.Acknowledge
		}
		h := buf[at : at+unix.NLMSG_HDRLEN]
		binary.NativeEndian.PutUint32(h[0:4], uint32(n))
		binary.NativeEndian.PutUint16(h[4:6], uint16(m.Header.Type))
		binary.NativeEndian.PutUint16(h[6:8], uint16(flags))
		binary.NativeEndian.PutUint32(h[8:12], uint32(i+1))
		copy(buf[at+unix.NLMSG_HDRLEN:], m.Data)
		at += n
	}
	return buf
}

func nlAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// sendRaw sends buf, whole messages, to the kernel in one sendmsg.
func sendRaw(conn *netlink.Conn, buf []byte) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return !errors.Is(serr, unix.EAGAIN)
	}); err != nil {
		return err
	}
	return serr
}
