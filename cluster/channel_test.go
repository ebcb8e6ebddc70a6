package cluster

import (
	"bytes"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestChannelMessagesAreChecked: a channel's messages reach the delegate
// one by one, two written at once included, each checked as a stream's
// first message is; the first that fails the check (another key, an
// unknown type) is counted, ends the channel, and nothing after it is
// delivered. memberlist never gets the stream.
func TestChannelMessagesAreChecked(t *testing.T) {
	otherKey := bytes.Repeat([]byte{9}, 32)
	for _, c := range []struct {
		name    string
		key     []byte
		hostile []byte
		reason  Reason
	}{
		{"no secret", nil, plainStream(0x42, []byte{1, 2, 3}), RejectUnknownType},
		{"secret", testKey, streamMessage([]byte("forged"), otherKey), RejectDecrypt},
	} {
		t.Run(c.name, func(t *testing.T) {
			ft, rs := newFakeTransport(), &refusals{}
			g := newScreenTransport(ft, newKeyring(c.key), rs.refuse, func(netip.Addr) bool { return true })
			defer g.Shutdown()
			var mu sync.Mutex
			var got [][]byte
			g.deliver = func(p []byte) {
				mu.Lock()
				got = append(got, bytes.Clone(p))
				mu.Unlock()
			}
			g.sessionLog.Store(log.New(io.Discard, "", 0)) // publishes deliver, as acceptSessions does
			near, far := net.Pipe()
			defer far.Close()
			ft.streams <- near
			far.SetDeadline(time.Now().Add(5 * time.Second))
			if err := openChannel(far, c.key, channelOpen, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("open: %v", err)
			}
			both := append(streamMessage([]byte("one"), c.key), streamMessage([]byte("two"), c.key)...)
			go func() {
				far.Write(both)
				far.Write(c.hostile)
				far.Write(streamMessage([]byte("three"), c.key))
			}()
			rs.wait(t, c.reason, 1)
			if _, err := far.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after the refused message the channel reads %v, want EOF", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 || string(got[0]) != "one" || string(got[1]) != "two" {
				t.Errorf("delivered %q, want one and two", got)
			}
			select {
			case s := <-g.StreamCh():
				t.Errorf("memberlist got the channel's stream from %v", s.RemoteAddr())
			default:
			}
		})
	}
}
