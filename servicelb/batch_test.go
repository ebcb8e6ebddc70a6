package servicelb

import (
	"bytes"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestMarshalBatch: the one buffer holds what netlink marshals message by
// message, numbered from 1, with the acknowledgement asked of one message
// only and no echo, each message padded to the netlink alignment.
func TestMarshalBatch(t *testing.T) {
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: 0x10, Flags: netlink.Request | netlink.Acknowledge}, Data: []byte{1, 2, 3}},
		{Header: netlink.Header{Type: 0xa06, Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Echo}, Data: bytes.Repeat([]byte{7}, 8)},
		{Header: netlink.Header{Type: 0x11, Flags: netlink.Request}, Data: []byte{4}},
	}
	var want []byte
	for i, m := range msgs {
		m.Header.Sequence = uint32(i + 1)
		m.Header.Flags &^= netlink.Acknowledge | netlink.Echo
		if i == 1 {
			m.Header.Flags |= netlink.Acknowledge
		}
		m.Header.Length = uint32(nlAlign(unix.NLMSG_HDRLEN + len(m.Data)))
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, b...)
	}
	if got := marshalBatch(msgs, 1); !bytes.Equal(got, want) {
		t.Errorf("marshalBatch:\n got %x\nwant %x", got, want)
	}
}
