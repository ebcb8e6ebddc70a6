package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"slices"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// A stream's first message, read whole before memberlist sees the stream
// (screen.go). memberlist reads a plaintext stream as it comes, a msgpack
// value at a time (readStream, handleConn in net.go), so only the message
// types it takes on an accepted stream are known here, with their layout:
//
//	user       type header{UserMsgLen} payload(UserMsgLen)
//	push/pull  type header{Nodes, UserStateLen, Join} Nodes×nodeState userState(UserStateLen)
//	ping       type ping{...}
//
// The headers are decoded with memberlist's own msgpack codec and handle,
// so they mean here what they mean to memberlist; the other values are
// only delimited.

// mlUserMsgHeader and mlPushPullHeader are memberlist's userMsgHeader and
// pushPullHeader (net.go): msgpack maps by field name.
type mlUserMsgHeader struct {
	UserMsgLen int
}

type mlPushPullHeader struct {
	Nodes        int
	UserStateLen int
	Join         bool
}

// mlMaxMsgpackDepth bounds the nesting of a msgpack value: memberlist's
// messages nest two deep.
const mlMaxMsgpackDepth = 16

// headReader reads the start of a stream into buf, which grows with what
// arrives (never with what a length field claims), up to max bytes. It
// reads what the conn has, so buf may hold bytes past the message: they
// are handed on with it. pos is where parsing stands in buf.
type headReader struct {
	r   io.Reader
	buf []byte
	pos int
	max int
	// channel: a channel's (channel.go), whose end may cut a message
	// short when the member stops mid-send; that is no refusal.
	channel bool
}

// headChunk is the most a single read asks for.
const headChunk = 32 << 10

var errHeadTooLong = errors.New("first message too long")

// fill reads until buf holds n bytes. The end of the stream before the
// first byte is io.EOF (an empty stream), after it io.ErrUnexpectedEOF.
func (h *headReader) fill(n int) error {
	if n > h.max {
		return errHeadTooLong
	}
	for len(h.buf) < n {
		h.buf = slices.Grow(h.buf, min(max(n-len(h.buf), 512), headChunk))
		k, err := h.r.Read(h.buf[len(h.buf):cap(h.buf)])
		h.buf = h.buf[:len(h.buf)+k]
		if len(h.buf) >= n {
			return nil
		}
		if err == io.EOF && len(h.buf) > 0 {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// take returns the next n bytes.
func (h *headReader) take(n int) ([]byte, error) {
	if n < 0 || n > h.max-h.pos {
		return nil, errHeadTooLong
	}
	if err := h.fill(h.pos + n); err != nil {
		return nil, err
	}
	h.pos += n
	return h.buf[h.pos-n : h.pos], nil
}

// uint reads a big-endian unsigned integer of n (1, 2, 4 or 8) bytes.
func (h *headReader) uint(n int) (uint64, error) {
	b, err := h.take(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// value reads one msgpack value and returns its encoding.
func (h *headReader) value() ([]byte, error) {
	start := h.pos
	if err := h.skip(0); err != nil {
		return nil, err
	}
	return h.buf[start:h.pos], nil
}

// skip reads past one msgpack value (the format's spec, msgpack/spec.md).
func (h *headReader) skip(depth int) error {
	if depth > mlMaxMsgpackDepth {
		return reject(RejectMalformed, "msgpack values nested over %d deep", mlMaxMsgpackDepth)
	}
	b, err := h.take(1)
	if err != nil {
		return err
	}
	var data uint64 // bytes that follow
	items := uint64(0)
	switch t := b[0]; {
	case t <= 0x7f, t >= 0xe0, t == 0xc0, t == 0xc2, t == 0xc3: // fixints, nil, bools
	case t <= 0x8f: // fixmap
		items = 2 * uint64(t&0x0f)
	case t <= 0x9f: // fixarray
		items = uint64(t & 0x0f)
	case t <= 0xbf: // fixstr
		data = uint64(t & 0x1f)
	case t == 0xc4 || t == 0xc5 || t == 0xc6: // bin 8, 16, 32
		data, err = h.uint(1 << (t - 0xc4))
	case t == 0xc7 || t == 0xc8 || t == 0xc9: // ext 8, 16, 32: and a type byte
		data, err = h.uint(1 << (t - 0xc7))
		data++
	case t == 0xca:
		data = 4
	case t == 0xcb:
		data = 8
	case t >= 0xcc && t <= 0xcf: // uint 8..64
		data = 1 << (t - 0xcc)
	case t >= 0xd0 && t <= 0xd3: // int 8..64
		data = 1 << (t - 0xd0)
	case t >= 0xd4 && t <= 0xd8: // fixext 1..16: and a type byte
		data = 1 + 1<<(t-0xd4)
	case t == 0xd9 || t == 0xda || t == 0xdb: // str 8, 16, 32
		data, err = h.uint(1 << (t - 0xd9))
	case t == 0xdc || t == 0xdd: // array 16, 32
		items, err = h.uint(2 << (t - 0xdc))
	case t == 0xde || t == 0xdf: // map 16, 32
		items, err = h.uint(2 << (t - 0xde))
		items *= 2
	default: // 0xc1, never used
		return reject(RejectMalformed, "msgpack type byte %#x", t)
	}
	if err != nil {
		return err
	}
	if data > uint64(h.max) {
		return errHeadTooLong
	}
	if _, err := h.take(int(data)); err != nil {
		return err
	}
	// Each item is a byte at least: max bounds the loop.
	for range items {
		if err := h.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

// mlHandle is the msgpack handle of the stream headers this package reads
// and writes, memberlist's format. One for all: a handle caches how it
// codes each type, and a fresh one per message (as memberlist does) cost
// 1.2 of 35 CPU-seconds in the 100-host benchmark. Safe for concurrent
// use while nothing changes its settings.
var mlHandle = &codec.MsgpackHandle{}

// header reads one msgpack value and decodes it into v as memberlist does.
func (h *headReader) header(v any) error {
	raw, err := h.value()
	if err != nil {
		return err
	}
	if err := codec.NewDecoderBytes(raw, mlHandle).Decode(v); err != nil {
		return reject(RejectMalformed, "stream header: %v", err)
	}
	return nil
}

// userMsgLenKey is how memberlist's codec writes mlUserMsgHeader: a map
// of one entry, whose key is the fixstr "UserMsgLen".
var userMsgLenKey = append([]byte{0x81, 0xa0 | byte(len("UserMsgLen"))}, "UserMsgLen"...)

// userHeader reads a user message's header. The codec is the reference;
// the header memberlist writes (and channel.go's streamMessage) is read
// without it: the codec builds a decoder for each, which was 1.3 of 35
// CPU-seconds in the 100-host benchmark, every message of every push
// having one (twice over on a channel).
func (h *headReader) userHeader() (mlUserMsgHeader, error) {
	start := h.pos
	raw, err := h.value()
	if err != nil {
		return mlUserMsgHeader{}, err
	}
	if n, ok := userMsgLen(raw); ok {
		return mlUserMsgHeader{UserMsgLen: n}, nil
	}
	h.pos = start
	var hd mlUserMsgHeader
	return hd, h.header(&hd)
}

// userMsgLen decodes raw, one msgpack value, when it is the map the codec
// writes for mlUserMsgHeader with an integer that fits an int; ok is false
// for anything else, which the codec then judges.
func userMsgLen(raw []byte) (n int, ok bool) {
	v, found := bytes.CutPrefix(raw, userMsgLenKey)
	if !found || len(v) == 0 {
		return 0, false
	}
	t, v := v[0], v[1:]
	var size int
	signed := false
	switch {
	case t <= 0x7f:
		return int(t), len(v) == 0
	case t >= 0xe0: // negative fixint
		return int(int8(t)), len(v) == 0
	case t >= 0xcc && t <= 0xcf: // uint 8..64
		size = 1 << (t - 0xcc)
	case t >= 0xd0 && t <= 0xd3: // int 8..64
		size, signed = 1<<(t-0xd0), true
	default:
		return 0, false
	}
	if len(v) != size {
		return 0, false
	}
	var u uint64
	for _, c := range v {
		u = u<<8 | uint64(c)
	}
	if signed {
		shift := 64 - 8*size
		return int(int64(u<<shift) >> shift), true
	}
	if u > math.MaxInt {
		return 0, false
	}
	return int(u), true
}

// plainMessage reads the rest of a plaintext stream's first message,
// whose type byte t (one of requestTypes) was read.
func (h *headReader) plainMessage(t byte) error {
	switch t {
	case mlUser:
		hd, err := h.userHeader()
		if err != nil {
			return err
		}
		if hd.UserMsgLen < 0 {
			return reject(RejectMalformed, "user message of %d bytes", hd.UserMsgLen)
		}
		_, err = h.take(hd.UserMsgLen)
		return err
	case mlPushPull:
		var hd mlPushPullHeader
		if err := h.header(&hd); err != nil {
			return err
		}
		if hd.Nodes < 0 || hd.UserStateLen < 0 {
			return reject(RejectMalformed, "push/pull of %d nodes and %d bytes", hd.Nodes, hd.UserStateLen)
		}
		for range hd.Nodes {
			if err := h.skip(0); err != nil {
				return err
			}
		}
		_, err := h.take(hd.UserStateLen)
		return err
	case mlPing:
		return h.skip(0)
	}
	return reject(RejectUnknownType, "stream of message type %d", t)
}

// encryptedMessage reads the rest of an encrypted stream's message: its
// length (4 bytes, big endian) and that many bytes. It returns the type
// and length, which memberlist authenticates as additional data, and the
// payload.
func (h *headReader) encryptedMessage() (aad, payload []byte, err error) {
	lb, err := h.take(4)
	if err != nil {
		return nil, nil, err
	}
	n := binary.BigEndian.Uint32(lb)
	if n > mlMaxStreamPayload {
		return nil, nil, reject(RejectMalformed, "encrypted stream of %d bytes", n)
	}
	if payload, err = h.take(int(n)); err != nil {
		return nil, nil, err
	}
	return h.buf[:5], payload, nil
}
