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
	"net/netip"
	"time"

	metrics "github.com/hashicorp/go-metrics"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/memberlist"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Channels. What an outbox sends a member (pushes, anti-entropy) goes over
// a TCP connection of its own kept open, a message after another, where
// the member is of this version (it takes sessions, streampool.go).
// memberlist's SendReliable dials a connection per message; a stream per
// message on a session still cost five frames and a write each, two
// goroutines, a check and memberlist's stream handling at the member, for
// a few hundred bytes; in a 100-host rollout, 99,000 times. Channels
// carried by yamux streams then cost a goroutine hand-off per message at
// each end and yamux's buffering: a quarter of the rollout's CPU (yamux's
// send and receive loops), with a session per pair to open before the
// first message.
//
// A channel's messages are memberlist's own stream messages (a user
// message, encrypted with the cluster key as memberlist would), so the
// screen checks each as it checks a stream's first message. The first
// says kindChannel and the dialer's gossip address; the member answers
// channelAck if the address is a live member's, from which the
// connection came, and reads the messages from then on, handing each to
// the delegate as memberlist would. A member that does not answer gets
// SendReliable, as a 0.1.0 member does. A write that fails closes the
// channel; the outbox retries, and the next send dials a new one.
//
// One connection per pair of members, used both ways, so that a host
// holds a descriptor per member, not two: the one dialed by the member of
// the lower name. That member sends on the connection it dialed and never
// on one it accepted; the other sends on the one it accepted from it, or,
// until there is one, on a connection it dialed itself, which it closes
// once it accepted the lower's (after its last write: nobody else writes
// on it, so nothing is lost). Both read every channel connection they
// hold with the member.

// channelAck is the member's answer to a channel's first message.
const channelAck byte = 0xca

// channel is a connection this node sends on to one member.
type channel struct {
	// mu serialises writes: a detached outbox's send (push.go) may still
	// be under way when the next starts. A leaf.
	mu   lockrank.Mutex[lockrank.Channel]
	conn net.Conn
}

// channelSink is the cluster's side of the channels the screen accepts.
type channelSink struct {
	from         func(addr netip.AddrPort, source netip.Addr) (name string, ok bool) // the dialer, if a live member at addr and source its host
	taken, ended func(name string, conn net.Conn)
	deliver      func([]byte)
}

// peerChannels are this node's channel connections with one member.
// Guarded by Cluster.chMu.
type peerChannels struct {
	send    *channel              // what this node sends on; nil: none
	all     map[net.Conn]struct{} // every channel connection with the member, send's included
	dialing chan struct{}         // non-nil while this node dials it; closed when done
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
		c.channelEnded(node.Name, ch.conn)
		return err
	}
	// Counted as memberlist counts what it writes to a stream, so that
	// its figure still covers all the gossip.
	metrics.IncrCounter([]string{"memberlist", "tcp", "sent"}, float32(len(frame)))
	return nil
}

// peerLocked returns name's channels, made if none. Caller holds chMu.
func (c *Cluster) peerLocked(name string) *peerChannels {
	pc := c.channels[name]
	if pc == nil {
		pc = &peerChannels{all: map[net.Conn]struct{}{}}
		c.channels[name] = pc
	}
	return pc
}

// channelTo returns the channel to send on to node, dialing one if there
// is none; nil if the node takes none or it could not be opened. One dial
// per member at a time: a send that finds one under way waits for it.
func (c *Cluster) channelTo(node *memberlist.Node) *channel {
	if c.pool == nil || !c.takesSessions(node.Name) || c.pool.self.Load() == nil {
		return nil
	}
	c.chMu.Lock()
	pc := c.peerLocked(node.Name)
	for pc.send == nil && pc.dialing != nil {
		wait := pc.dialing
		c.chMu.Unlock()
		<-wait
		c.chMu.Lock()
		if pc.send == nil { // the dial failed: so would this one, now
			c.chMu.Unlock()
			return nil
		}
	}
	if pc.send != nil {
		ch := pc.send
		c.chMu.Unlock()
		return ch
	}
	done := make(chan struct{})
	pc.dialing = done
	c.chMu.Unlock()

	conn := c.dialChannel(node)
	c.chMu.Lock()
	defer c.chMu.Unlock()
	pc.dialing = nil
	close(done)
	if conn == nil {
		return nil
	}
	switch {
	case c.channels[node.Name] != pc: // the member left or restarted meanwhile
		conn.Close()
		return nil
	case pc.send != nil:
		// The member's own connection was taken meanwhile (its name is
		// the lower): it never writes on this one, nor was anything sent
		// on it.
		conn.Close()
		return pc.send
	}
	pc.all[conn] = struct{}{}
	pc.send = &channel{conn: conn}
	c.wg.Add(1)
	go c.readDialed(node.Name, conn)
	return pc.send
}

// dialChannel dials node and opens a channel on the connection; nil if
// either fails.
func (c *Cluster) dialChannel(node *memberlist.Node) net.Conn {
	conn, err := c.pool.dial(node.Address(), c.tcpTimeout)
	if err != nil {
		return nil
	}
	c.channelsDialed.Add(1)
	if err := openChannel(conn, c.keys.primary(), channelOpenFrom(*c.pool.self.Load()), time.Now().Add(c.tcpTimeout)); err != nil {
		conn.Close()
		return nil
	}
	return conn
}

// readDialed reads what the member sends on a connection this node
// dialed, until it ends (the transport closes its dials when the cluster
// does).
func (c *Cluster) readDialed(name string, conn net.Conn) {
	defer c.wg.Done()
	c.screen.readChannel(conn, (&delegate{c}).NotifyMsg)
	c.channelEnded(name, conn)
}

// channelDialer returns the member that dialed a channel from source,
// giving its gossip address addr: a live member's, on that host.
func (c *Cluster) channelDialer(addr netip.AddrPort, source netip.Addr) (string, bool) {
	name, ok := c.memberAtGossipAddr(addr)
	return name, ok && addr.Addr() == source
}

// channelTaken is the screen's report of a channel accepted from member
// name, answered: a connection dialed by a member of a lower name becomes
// the one this node sends on, and the one this node dialed, if any, is
// closed once its last write is done.
func (c *Cluster) channelTaken(name string, conn net.Conn) {
	c.chMu.Lock()
	pc := c.peerLocked(name)
	pc.all[conn] = struct{}{}
	var old *channel
	if name < c.name {
		old, pc.send = pc.send, &channel{conn: conn}
		if old != nil {
			delete(pc.all, old.conn)
		}
	}
	c.chMu.Unlock()
	if old != nil {
		old.mu.Lock()
		old.conn.Close()
		old.mu.Unlock()
	}
}

// channelEnded forgets a channel connection with member name that ended,
// or whose write failed, and closes it.
func (c *Cluster) channelEnded(name string, conn net.Conn) {
	c.chMu.Lock()
	if pc := c.channels[name]; pc != nil {
		delete(pc.all, conn)
		if pc.send != nil && pc.send.conn == conn {
			pc.send = nil
		}
	}
	c.chMu.Unlock()
	conn.Close()
}

// closeChannel closes every channel connection with member name: it left
// or restarted.
func (c *Cluster) closeChannel(name string) {
	c.chMu.Lock()
	pc := c.channels[name]
	delete(c.channels, name)
	c.chMu.Unlock()
	if pc == nil {
		return
	}
	for conn := range pc.all {
		conn.Close()
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

// channelOpenFrom is the payload of a channel's first message from a node
// whose gossip address is self. It is not a plugin message (no
// wireMagic): were it ever handed to the delegate, it would be refused as
// malformed.
func channelOpenFrom(self string) []byte { return append([]byte(channelOpen), self...) }

const channelOpen = "overlay-plugin channel 2 "

// channelFrom returns the gossip address a stream's checked first message
// gives, if it opens a channel.
func channelFrom(head []byte) (netip.AddrPort, bool) {
	p, err := userPayload(head)
	if err != nil || !bytes.HasPrefix(p, []byte(channelOpen)) {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(string(p[len(channelOpen):]))
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), err == nil
}

// serveChannel answers a channel's first message from member name, tells
// the cluster, and hands the messages that follow to it until the channel
// ends or one is refused.
func (g *screenTransport) serveChannel(conn net.Conn, name string) {
	defer conn.Close()
	stop := context.AfterFunc(g.ctx, func() { conn.Close() })
	defer stop()
	defer g.channels.ended(name, conn)
	if err := conn.SetDeadline(time.Now().Add(g.headWait)); err != nil {
		return
	}
	if _, err := conn.Write([]byte{channelAck}); err != nil {
		return
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return
	}
	g.channels.taken(name, conn)
	g.readChannel(conn, g.channels.deliver)
}

// readChannel hands a channel's messages to deliver, each checked as a
// stream's first message is, until the channel ends or one is refused.
func (g *screenTransport) readChannel(conn net.Conn, deliver func([]byte)) {
	h := &headReader{r: conn, max: maxHead, channel: true}
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
