package servicelb

import (
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
	for i := range msgs {
		msgs[i].Header.Flags &^= netlink.Acknowledge
	}
	msgs[last].Header.Flags |= netlink.Acknowledge
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		return fmt.Errorf("netfilter socket: %w", err)
	}
	defer conn.Close()
	if err := sizeBuffers(conn, send, recv); err != nil {
		return err
	}
	sent, err := conn.SendMessages(msgs)
	if err != nil {
		return fmt.Errorf("send batch: %w", err)
	}
	for {
		// Receive returns a message's failure as an error.
		replies, err := conn.Receive()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if r.Header.Sequence == sent[last].Header.Sequence {
				return nil
			}
		}
	}
}
