package health

import (
	"encoding/binary"
	"errors"
)

// A probe message: magic(4) kind(1) state(1) size(2) seq(8), then
// padding up to the probe's size (state and size 0). A reply repeats the
// request's seq; it and a notice carry, in state and size, the sender's
// view of its own path back (wireState, and the largest packet crossing
// it while that is in trouble): the probes see one direction, and a
// black hole only the other way is told this way. No padding.
const (
	msgLen     = 16
	kindProbe  = 1
	kindReply  = 2
	kindNotice = 3
)

// wireStates are the states as a message carries them.
var wireStates = []State{StateUnknown, StateUp, StateDown, StateMTU}

func wireState(s State) byte {
	for i, w := range wireStates {
		if w == s {
			return byte(i)
		}
	}
	return 0
}

var magic = [4]byte{'o', 'v', 'h', 'c'}

type message struct {
	kind  byte
	state byte
	size  uint16
	seq   uint64
}

// appendMessage writes m into buf (reused), padded with zeros to pad
// bytes when pad exceeds msgLen.
func appendMessage(buf []byte, m message, pad int) []byte {
	b := append(buf[:0], magic[:]...)
	b = append(b, m.kind, m.state)
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
	if len(b) < msgLen || [4]byte(b[:4]) != magic || b[4] < kindProbe || b[4] > kindNotice || int(b[5]) >= len(wireStates) {
		return message{}, errNotProbe
	}
	return message{kind: b[4], state: b[5], size: binary.BigEndian.Uint16(b[6:8]), seq: binary.BigEndian.Uint64(b[8:16])}, nil
}
