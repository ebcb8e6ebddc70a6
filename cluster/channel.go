package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/memberlist"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Channels. What an outbox sends a member (pushes, anti-entropy) goes over
// one stream per member kept open, a message after another, where the
// member takes sessions (streampool.go). memberlist's SendReliable opens a
// stream per message: on a session that is still five frames and a write
// each, two goroutines, a check and memberlist's stream handling at the
// member, for a few hundred bytes; in a 100-host rollout, 99,000 times.
//
// A channel's messages are memberlist's own stream messages (a user
// message, encrypted with the cluster key as memberlist would), so the
// screen checks each as it checks a stream's first message. The first
// says kindChannel; the member answers channelAck and reads the messages
// from then on, handing each to the delegate as memberlist would. A
// member that does not answer gets SendReliable, as a 0.1.0 member does.
// A write that fails closes the channel; the outbox retries, and the next
// send opens a new one.

// channelAck is the member's answer to a channel's first message.
const channelAck byte = 0xca

// channel is an open channel to one member.
type channel struct {
	// mu serialises writes: a detached outbox's send (push.go) may still
	// be under way when the next starts. A leaf.
	mu   lockrank.Mutex[lockrank.Channel]
	conn net.Conn
}

// sendDirect sends msg to node: over its channel where it has one or takes
// one, by SendReliable otherwise.
func (c *Cluster) sendDirect(node *memberlist.Node, msg []byte) error {
	ch := c.channelTo(node)
	if ch == nil {
		return c.ml.SendReliable(node, msg)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	frame := streamMessage(msg, c.keys.primary())
	err := ch.conn.SetWriteDeadline(time.Now().Add(c.tcpTimeout))
	if err == nil {
		_, err = ch.conn.Write(frame)
	}
	if err != nil {
		c.dropChannel(node.Name, ch)
		return err
	}
	// Counted as memberlist counts what it writes to a stream, so that
	// its figure still covers all the gossip.
	metrics.IncrCounter([]string{"memberlist", "tcp", "sent"}, float32(len(frame)))
	return nil
}

// channelTo returns node's channel, opening it if there is none; nil if
// the node takes none.
func (c *Cluster) channelTo(node *memberlist.Node) *channel {
	if c.pool == nil || !c.takesSessions(node.Name) {
		return nil
	}
	c.chMu.Lock()
	ch := c.channels[node.Name]
	c.chMu.Unlock()
	if ch != nil {
		return ch
	}
	conn, err := c.pool.openSession(node.Name, node.Address(), c.tcpTimeout)
	if err != nil {
		return nil
	}
	if err := openChannel(conn, c.keys.primary(), channelOpen, time.Now().Add(c.tcpTimeout)); err != nil {
		conn.Close()
		return nil
	}
	ch = &channel{conn: conn}
	c.chMu.Lock()
	defer c.chMu.Unlock()
	if old := c.channels[node.Name]; old != nil { // opened meanwhile by another send
		conn.Close()
		return old
	}
	c.channels[node.Name] = ch
	return ch
}

// dropChannel closes ch and forgets it, if it is still name's.
func (c *Cluster) dropChannel(name string, ch *channel) {
	c.chMu.Lock()
	if c.channels[name] == ch {
		delete(c.channels, name)
	}
	c.chMu.Unlock()
	ch.conn.Close()
}

// closeChannel closes member name's channel: it left or restarted.
func (c *Cluster) closeChannel(name string) {
	c.chMu.Lock()
	ch := c.channels[name]
	delete(c.channels, name)
	c.chMu.Unlock()
	if ch != nil {
		ch.conn.Close()
	}
}

// openChannel sends the first message and waits for the answer.
func openChannel(conn net.Conn, key, first []byte, deadline time.Time) error {
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := conn.Write(streamMessage(first, key)); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return err
	}
	if b[0] != channelAck {
		return fmt.Errorf("channel answered %#x", b[0])
	}
	return conn.SetDeadline(time.Time{})
}

// streamMessage is payload as memberlist sends a user message on a
// stream (rawSendMsgStream, encryptLocalState): type, msgpack header and
// payload; with a key, that encrypted (AES-GCM, encryption version 1)
// behind its type and length, which are the additional data.
func streamMessage(payload, key []byte) []byte {
	var plain bytes.Buffer
	plain.WriteByte(mlUser)
	if err := codec.NewEncoder(&plain, mlHandle).Encode(&mlUserMsgHeader{UserMsgLen: len(payload)}); err != nil {
		panic(err) // a struct of one int always encodes
	}
	plain.Write(payload)
	if key == nil {
		return plain.Bytes()
	}
	size := 1 + mlNonceSize + plain.Len() + mlTagSize
	out := make([]byte, 5, 5+size)
	out[0] = mlEncrypt
	binary.BigEndian.PutUint32(out[1:5], uint32(size))
	gcm, err := gcmFor(key)
	if err != nil {
		panic(err) // New checks the key's length
	}
	out = append(out, 1)
	nonce := make([]byte, mlNonceSize)
	rand.Read(nonce)
	out = append(out, nonce...)
	return gcm.Seal(out, nonce, plain.Bytes(), out[:5])
}

// eof is a reader at its end.
type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// userPayload is the payload of a user message (type, header, payload).
func userPayload(msg []byte) ([]byte, error) {
	h := &headReader{r: eof{}, buf: msg, max: len(msg)} // all of it is in buf
	t, err := h.take(1)
	if err != nil {
		return nil, err
	}
	if t[0] != mlUser {
		return nil, reject(RejectUnknownType, "channel message of type %d", t[0])
	}
	hd, err := h.userHeader()
	if err != nil {
		return nil, err
	}
	if hd.UserMsgLen < 0 || h.pos+hd.UserMsgLen != len(msg) {
		return nil, reject(RejectMalformed, "user message of %d bytes in %d", hd.UserMsgLen, len(msg)-h.pos)
	}
	return msg[h.pos:], nil
}

// isChannelOpen says whether a stream's checked first message opens a
// channel.
func isChannelOpen(head []byte) bool {
	p, err := userPayload(head)
	return err == nil && bytes.Equal(p, channelOpen)
}

// channelOpen is the payload of a channel's first message. It is not a
// plugin message (no wireMagic): were it ever handed to the delegate, it
// would be refused as malformed.
var channelOpen = []byte("overlay-plugin channel 1")

// serveChannel answers a channel's first message and hands the messages
// that follow to deliver, each checked as a stream's first message is,
// until the channel ends or one is refused.
func (g *screenTransport) serveChannel(conn net.Conn, deliver func([]byte)) {
	defer conn.Close()
	stop := context.AfterFunc(g.ctx, func() { conn.Close() })
	defer stop()
	if err := conn.SetDeadline(time.Now().Add(g.headWait)); err != nil {
		return
	}
	if _, err := conn.Write([]byte{channelAck}); err != nil {
		return
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return
	}
	h := &headReader{r: conn, max: maxHead}
	for {
		msg, err := g.readMessage(h, conn)
		if err != nil {
			return
		}
		p, err := userPayload(msg)
		if err != nil {
			var r *rejection
			if errors.As(err, &r) {
				g.refuse("stream", conn.RemoteAddr(), r)
			}
			return
		}
		deliver(p)
		// What was read past the message starts the next.
		rest := copy(h.buf, h.buf[h.pos:])
		h.buf, h.pos = h.buf[:rest], 0
	}
}
