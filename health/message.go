package health

import (
	"encoding/binary"
	"errors"
)

// A probe message: magic(4) kind(1) reserved(1) size(2) seq(8), then
// padding up to the probe's size. A reply repeats the request's seq and
// says in size how many bytes of it arrived; it carries no padding.
const (
	msgLen    = 16
	kindProbe = 1
	kindReply = 2
)

var magic = [4]byte{'o', 'v', 'h', 'c'}

type message struct {
	kind byte
	size uint16
	seq  uint64
}

// appendMessage writes m into buf (reused), padded with zeros to pad
// bytes when pad exceeds msgLen.
func appendMessage(buf []byte, m message, pad int) []byte {
	b := append(buf[:0], magic[:]...)
	b = append(b, m.kind, 0)
	b = binary.BigEndian.AppendUint16(b, m.size)
	b = binary.BigEndian.AppendUint64(b, m.seq)
	for len(b) < pad {
		b = append(b, 0)
	}
	return b
}

var errNotProbe = errors.New("not a health probe message")

// parseMessage reads what appendMessage wrote; anything else, from
// whoever can reach the endpoint, is an error.
func parseMessage(b []byte) (message, error) {
	if len(b) < msgLen || [4]byte(b[:4]) != magic || (b[4] != kindProbe && b[4] != kindReply) {
		return message{}, errNotProbe
	}
	return message{kind: b[4], size: binary.BigEndian.Uint16(b[6:8]), seq: binary.BigEndian.Uint64(b[8:16])}, nil
}
