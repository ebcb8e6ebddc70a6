package cluster

import (
	"bytes"
	"math"
	"testing"

	"github.com/hashicorp/go-msgpack/v2/codec"
)

// TestUserHeaderMatchesTheCodec: the header read without the codec means
// what the codec makes of it, for the lengths memberlist and
// streamMessage write and for every integer encoding; anything else is
// left to the codec.
func TestUserHeaderMatchesTheCodec(t *testing.T) {
	var raws [][]byte
	for _, n := range []int{0, 1, 31, 127, 128, 255, 256, 65535, 65536, 1 << 31, math.MaxInt64, -1, -32, -33, -128, -129, math.MinInt64} {
		var b bytes.Buffer
		if err := codec.NewEncoder(&b, mlHandle).Encode(&mlUserMsgHeader{UserMsgLen: n}); err != nil {
			t.Fatal(err)
		}
		raws = append(raws, b.Bytes())
	}
	key := string(userMsgLenKey)
	for _, tail := range []string{"\xcc\x05", "\xcd\x01\x00", "\xce\x00\x01\x00\x00", "\xcf\x00\x00\x00\x00\x00\x00\x01\x00",
		"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", "\xd0\x05", "\xd0\xfb", "\xd1\xff\x00", "\xd3\x80\x00\x00\x00\x00\x00\x00\x00"} {
		raws = append(raws, []byte(key+tail))
	}
	for _, r := range raws {
		var want mlUserMsgHeader
		werr := codec.NewDecoderBytes(r, mlHandle).Decode(&want)
		h := &headReader{r: bytes.NewReader(nil), buf: r, max: len(r)}
		got, err := h.userHeader()
		if (err == nil) != (werr == nil) || got != want || (err == nil && h.pos != len(r)) {
			t.Errorf("% x: %+v (%v, at %d), the codec %+v (%v)", r, got, err, h.pos, want, werr)
		}
	}
	// Not the codec's shape: the codec decides.
	for _, r := range []string{"\x81\xaaUserMsgLeN\x05", "\x82\xaaUserMsgLen\x05\xa1x\x01", "\x81\xaaUserMsgLen\xc0", "\x80"} {
		if _, ok := userMsgLen([]byte(r)); ok {
			t.Errorf("% x read without the codec", r)
		}
	}
}

// TestUserPayloadAllocatesNothing: a channel message's payload is found
// without allocating, in plaintext as memberlist frames it.
func TestUserPayloadAllocatesNothing(t *testing.T) {
	msg := streamMessage(bytes.Repeat([]byte{7}, 300), nil)
	if n := testing.AllocsPerRun(100, func() {
		if p, err := userPayload(msg); err != nil || len(p) != 300 {
			t.Fatal(p, err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per message", n)
	}
}
