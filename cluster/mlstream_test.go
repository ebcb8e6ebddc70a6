package cluster

import (
	"bytes"
	"errors"
	"io"
	"math"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// msgpack encodes v as memberlist does.
func msgpack(t testing.TB, v any) []byte {
	t.Helper()
	var out []byte
	if err := codec.NewEncoderBytes(&out, &codec.MsgpackHandle{}).Encode(v); err != nil {
		t.Fatal(err)
	}
	return out
}

// plainStream is a message as memberlist writes it on a stream without a
// key: its type, then its parts.
func plainStream(typ byte, parts ...[]byte) []byte {
	return append([]byte{typ}, bytes.Join(parts, nil)...)
}

// plainUser is a user message on a stream without a key.
func plainUser(t testing.TB, payload []byte) []byte {
	return plainStream(mlUser, msgpack(t, mlUserMsgHeader{len(payload)}), payload)
}

// memberlist's own stream messages, as it encodes them (net.go's structs,
// by field name).
type testPing struct {
	SeqNo      uint32
	Node       string
	SourceAddr []byte `codec:",omitempty"`
	SourcePort uint16 `codec:",omitempty"`
	SourceNode string `codec:",omitempty"`
}

type testNodeState struct {
	Name        string
	Addr        []byte
	Port        uint16
	Meta        []byte
	Incarnation uint32
	State       int
	Vsn         []uint8
}

func testPushPull(t testing.TB, state []byte) []byte {
	nodes := []testNodeState{
		{Name: "a", Addr: []byte{198, 51, 100, 1}, Port: 7947, Meta: bytes.Repeat([]byte{7}, 300), Incarnation: 3, Vsn: []uint8{1, 5, 2, 2, 3, 3}},
		{Name: "b", Addr: []byte{198, 51, 100, 2}, Port: 7947, State: 2, Vsn: []uint8{1, 5, 2, 2, 3, 3}},
	}
	parts := [][]byte{msgpack(t, mlPushPullHeader{Nodes: len(nodes), UserStateLen: len(state), Join: true})}
	for _, n := range nodes {
		parts = append(parts, msgpack(t, n))
	}
	return plainStream(mlPushPull, append(parts, state)...)
}

// readPlain reads a plaintext first message from b as the screen does.
func readPlain(b []byte) (int, error) {
	h := &headReader{r: bytes.NewReader(b), max: maxHead}
	t, err := h.take(1)
	if err != nil {
		return 0, err
	}
	err = h.plainMessage(t[0])
	return h.pos, err
}

// The messages memberlist sends on a stream are read to their last byte,
// and no further.
func TestPlainMessagesReadWhole(t *testing.T) {
	for name, msg := range map[string][]byte{
		"user":             plainUser(t, bytes.Repeat([]byte{0x42}, 70000)),
		"empty user":       plainUser(t, nil),
		"push/pull":        testPushPull(t, bytes.Repeat([]byte{9}, 5000)),
		"push/pull, empty": plainStream(mlPushPull, msgpack(t, mlPushPullHeader{})),
		"ping":             plainStream(mlPing, msgpack(t, testPing{SeqNo: 9, Node: "a", SourceAddr: []byte{1, 2, 3, 4}, SourcePort: 7947, SourceNode: "b"})),
	} {
		trailer := []byte("next")
		n, err := readPlain(append(bytes.Clone(msg), trailer...))
		if err != nil || n != len(msg) {
			t.Errorf("%s: read %d bytes of %d: %v", name, n, len(msg), err)
		}
	}
}

// Every msgpack type is delimited as the codec encodes it.
func TestMsgpackSkip(t *testing.T) {
	values := []any{
		nil, true, false, 0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, uint64(math.MaxUint64),
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32 - 1, int64(math.MinInt64),
		float32(1.5), 2.5, "", "short", string(bytes.Repeat([]byte{'s'}, 40)), string(bytes.Repeat([]byte{'s'}, 300)),
		string(bytes.Repeat([]byte{'s'}, 70000)), []byte{}, []byte{1, 2}, bytes.Repeat([]byte{1}, 300), bytes.Repeat([]byte{1}, 70000),
		[]int{}, []int{1, 2, 3}, make([]int, 20), make([]int, 70000),
		map[string]int{}, map[string]int{"a": 1}, map[string][]string{"a": {"b", "c"}, "d": nil},
		testNodeState{Name: "x", Vsn: []uint8{1, 2}},
	}
	big := map[int]int{}
	for i := range 70000 {
		big[i] = i
	}
	values = append(values, big)
	for _, v := range values {
		enc := msgpack(t, v)
		h := &headReader{r: bytes.NewReader(append(bytes.Clone(enc), 0xc1)), max: maxHead}
		if raw, err := h.value(); err != nil || !bytes.Equal(raw, enc) {
			t.Errorf("%T of %d bytes (%x...): read %d bytes: %v", v, len(enc), enc[:min(len(enc), 8)], len(raw), err)
		}
	}
	// ext and fixext, which the codec writes only for registered types.
	for _, enc := range [][]byte{{0xd4, 1, 0}, {0xd8, 1}, {0xc7, 2, 1, 0, 0}, {0xc9, 0, 0, 0, 1, 5, 0}} {
		enc = append(enc, make([]byte, max(0, extLen(enc)-len(enc)))...)
		h := &headReader{r: bytes.NewReader(enc), max: maxHead}
		if raw, err := h.value(); err != nil || !bytes.Equal(raw, enc) {
			t.Errorf("ext %x: read %d bytes: %v", enc, len(raw), err)
		}
	}
}

// extLen is the length of an ext or fixext value starting with b.
func extLen(b []byte) int {
	switch b[0] {
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return 2 + 1<<(b[0]-0xd4)
	case 0xc7:
		return 3 + int(b[1])
	case 0xc9:
		return 6 + int(b[4])
	}
	return len(b)
}

// What a stranger may send instead of a first message: each is refused
// with its reason, or ends with the stream, never reads past its end and
// never allocates what a length field claims.
func TestPlainMessagesRefused(t *testing.T) {
	huge := []byte{0xdb, 0xff, 0xff, 0xff, 0xff} // a str of 4 GiB
	deep := bytes.Repeat([]byte{0x91}, mlMaxMsgpackDepth+2)
	for _, c := range []struct {
		name string
		msg  []byte
		want Reason // numReasons: no refusal, the stream ends
	}{
		{"user header not a map", plainStream(mlUser, []byte{0x42}), RejectMalformed},
		{"user header of another type", plainStream(mlUser, msgpack(t, map[string]string{"UserMsgLen": "x"})), RejectMalformed},
		{"negative user length", plainStream(mlUser, msgpack(t, map[string]int{"UserMsgLen": -1})), RejectMalformed},
		{"user length past the bound", plainStream(mlUser, msgpack(t, map[string]int{"UserMsgLen": maxHead})), RejectMalformed},
		{"negative node count", plainStream(mlPushPull, msgpack(t, map[string]int{"Nodes": -1})), RejectMalformed},
		{"unused type byte", plainStream(mlPing, []byte{0xc1}), RejectMalformed},
		{"nested too deep", plainStream(mlPing, deep), RejectMalformed},
		{"a str of 4 GiB", plainStream(mlPing, huge), RejectMalformed},
		{"4 billion map entries", plainStream(mlPing, []byte{0xdf, 0xff, 0xff, 0xff, 0xff}), numReasons},
		{"cut short", plainUser(t, make([]byte, 100))[:50], numReasons},
		{"ack on an accepted stream", []byte{mlAckResp}, RejectUnknownType},
	} {
		_, err := readPlain(c.msg)
		var r *rejection
		switch {
		case errors.As(err, &r):
			if r.reason != c.want {
				t.Errorf("%s: refused as %v (%v), want %v", c.name, r.reason, r.err, c.want)
			}
		case errors.Is(err, errHeadTooLong) && c.want == RejectMalformed:
		case errors.Is(err, io.ErrUnexpectedEOF) && c.want == numReasons:
		default:
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// No input makes the reader panic or read past what it was given.
func FuzzPlainMessage(f *testing.F) {
	f.Add(plainUser(f, []byte("hello")))
	f.Add(testPushPull(f, []byte("state")))
	f.Add(plainStream(mlPing, msgpack(f, testPing{SeqNo: 1, Node: "n"})))
	f.Add([]byte{mlPushPull, 0x83, 0xa5, 'N', 'o', 'd', 'e', 's', 0xce, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, _ := readPlain(b)
		if n > len(b) {
			t.Fatalf("read %d bytes of %d", n, len(b))
		}
	})
}
