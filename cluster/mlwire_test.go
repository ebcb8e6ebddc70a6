package cluster

import (
	"bytes"
	"compress/lzw"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"hash/crc32"
	"io"
	"testing"
)

var testKey = bytes.Repeat([]byte{7}, 32)

// seal encrypts msg as memberlist's encryptPayload does with version 1.
func seal(t testing.TB, key, msg, aad []byte) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 1+mlNonceSize, 1+mlNonceSize+len(msg)+mlTagSize)
	out[0] = 1
	if _, err := rand.Read(out[1:]); err != nil {
		t.Fatal(err)
	}
	return gcm.Seal(out, out[1:1+mlNonceSize], msg, aad)
}

// sealStream frames msg as memberlist's encryptLocalState does.
func sealStream(t testing.TB, key, msg []byte) []byte {
	head := []byte{mlEncrypt, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(head[1:], uint32(1+mlNonceSize+len(msg)+mlTagSize))
	return append(head, seal(t, key, msg, head)...)
}

func compound(parts ...[]byte) []byte {
	b := []byte{mlCompound, byte(len(parts))}
	for _, p := range parts {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	}
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func withCRC(msg []byte) []byte {
	b := []byte{mlHasCrc, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], crc32.ChecksumIEEE(msg))
	return append(b, msg...)
}

// bombSize is what the test's bomb inflates to: the 40 MiB.
const bombSize = 40 << 20

// lzwBomb is a memberlist compress message ({Algo: lzw, Buf}, msgpack)
// whose LZW payload inflates to bombSize zero bytes, as memberlist's
// decompressPayload would inflate it.
func lzwBomb(t testing.TB) []byte {
	t.Helper()
	var z bytes.Buffer
	w := lzw.NewWriter(&z, lzw.LSB, 8)
	if _, err := w.Write(make([]byte, bombSize)); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b := []byte{mlCompress, 0x82, 0xa4, 'A', 'l', 'g', 'o', 0x00, 0xa3, 'B', 'u', 'f', 0xc6}
	b = binary.BigEndian.AppendUint32(b, uint32(z.Len()))
	return append(b, z.Bytes()...)
}

// inflated is how many bytes the bomb's LZW payload decompresses to.
func inflated(t testing.TB, bomb []byte) int64 {
	r := lzw.NewReader(bytes.NewReader(bomb[17:]), lzw.LSB, 8)
	defer r.Close()
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var ping = []byte{mlPing, 0x80} // a ping with an empty msgpack map

func TestCheckPacket(t *testing.T) {
	bomb := lzwBomb(t)
	user := []byte{mlUser, 1, 2, 3}
	for _, c := range []struct {
		name string
		buf  []byte
		key  []byte
		want Reason // -1: accepted
	}{
		{"ping", ping, nil, -1},
		{"compound of pings and user messages", compound(ping, user), nil, -1},
		{"with a checksum", withCRC(compound(ping, user)), nil, -1},
		{"encrypted", seal(t, testKey, withCRC(ping), nil), testKey, -1},
		{"empty", nil, nil, RejectMalformed},
		{"compressed", bomb, nil, RejectCompressed},
		{"compressed in a compound", compound(ping, bomb[:1000]), nil, RejectCompressed},
		{"compressed in a compound in a compound", compound(compound(bomb[:100])), nil, RejectCompressed},
		{"compressed behind a checksum", withCRC(bomb), nil, RejectCompressed},
		{"compressed and encrypted", seal(t, testKey, withCRC(bomb), nil), testKey, RejectCompressed},
		{"unknown type", []byte{99, 1}, nil, RejectUnknownType},
		{"checksum inside a compound", compound(withCRC(ping)), nil, RejectUnknownType},
		{"labelled", append([]byte{mlHasLabel, 1, 'x'}, ping...), nil, RejectUnknownType},
		{"truncated compound", compound(ping, user)[:7], nil, RejectMalformed},
		{"compound without parts count", []byte{mlCompound}, nil, RejectMalformed},
		{"compounds nested too deep", compound(compound(compound(compound(compound(ping))))), nil, RejectMalformed},
		{"wrong checksum", append(withCRC(ping), 0), nil, RejectMalformed},
		{"plaintext in an encrypted cluster", withCRC(ping), testKey, RejectPlain},
		{"another key", seal(t, bytes.Repeat([]byte{8}, 32), ping, nil), testKey, RejectDecrypt},
		{"garbage in an encrypted cluster", bytes.Repeat([]byte{0xee}, 60), testKey, RejectDecrypt},
	} {
		plain, r := checkPacket(c.buf, newKeyring(c.key))
		switch {
		case r == nil && c.key != nil && !bytes.Equal(plain, withCRC(ping)):
			t.Errorf("%s: memberlist would get %x, want the plaintext %x", c.name, plain, withCRC(ping))
		case r == nil && c.key == nil && !bytes.Equal(plain, c.buf):
			t.Errorf("%s: memberlist would get %x, want the datagram as it came", c.name, plain)
		case c.want < 0 && r != nil:
			t.Errorf("%s: refused (%v: %v)", c.name, r.reason, r.err)
		case c.want >= 0 && r == nil:
			t.Errorf("%s: accepted, want %v", c.name, c.want)
		case c.want >= 0 && r.reason != c.want:
			t.Errorf("%s: refused as %v (%v), want %v", c.name, r.reason, r.err, c.want)
		}
	}
}

// The bomb of issue 12: some 31 KB that memberlist inflates to 40 MiB.
// checkPacket refuses it by its type byte; screen_test checks that
// memberlist is handed none of it.
func TestLZWBombIsOne(t *testing.T) {
	bomb := lzwBomb(t)
	n := inflated(t, bomb)
	t.Logf("bomb: %d bytes, inflating to %d (×%d)", len(bomb), n, n/int64(len(bomb)))
	if n != bombSize || len(bomb) > 64<<10 {
		t.Fatalf("bomb of %d bytes inflates to %d", len(bomb), n)
	}
}
