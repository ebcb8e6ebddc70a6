package cluster

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
)

// What memberlist v0.7.0 accepts from the network, checked before it sees
// it (screen.go). memberlist's message types are unexported: these are the
// values of its messageType constants (net.go, lines 50-74, "ONLY APPEND
// TO THIS LIST": they are part of its protocol).
const (
	mlPing         = 0
	mlIndirectPing = 1
	mlAckResp      = 2
	mlSuspect      = 3
	mlAlive        = 4
	mlDead         = 5
	mlPushPull     = 6
	mlCompound     = 7
	mlUser         = 8
	mlCompress     = 9
	mlEncrypt      = 10
	mlNackResp     = 11
	mlHasCrc       = 12
	mlErr          = 13
	mlHasLabel     = 244
)

// Sizes of memberlist's encrypted payloads (security.go): version(1)
// nonce(12) ciphertext tag(16); version 0 pads the plaintext (PKCS7, 16).
// A stream's payload follows type(1) length(4, big endian), and its length
// is at most maxPushStateBytes (net.go).
const (
	mlNonceSize        = 12
	mlTagSize          = 16
	mlMaxStreamPayload = 20 * 1024 * 1024
	// mlMaxCompoundDepth bounds compounds inside compounds: memberlist
	// never nests them, and each level is a recursion of its handler.
	mlMaxCompoundDepth = 4
)

// rejection is a reason and what it was about.
type rejection struct {
	reason Reason
	err    error
}

func reject(r Reason, format string, args ...any) *rejection {
	return &rejection{r, fmt.Errorf(format, args...)}
}

// A rejection is an error where a stream's parsing fails (mlstream.go).
func (r *rejection) Error() string { return fmt.Sprintf("%v: %v", r.reason, r.err) }

// checkPacket says whether memberlist may take a datagram, in the order
// memberlist handles one (ingestPacket, handleCommand): label header,
// decryption with a gossip key (keyring.go) if the cluster has one, CRC, then the message
// types, compounds opened. Compression sits inside the encryption, so the
// datagram is decrypted here to see it; what memberlist gets is the
// plaintext (returned), which it takes as it is (GossipVerifyIncoming is
// off, New): each datagram is decrypted once. A compressed message is
// refused whatever it holds: this cluster never sends one
// (EnableCompression is off), and memberlist would inflate it up to 40
// MiB, some thousand times its size, before looking at it.
func checkPacket(buf []byte, keys *keyring) ([]byte, *rejection) {
	if len(buf) > 0 && buf[0] == mlHasLabel {
		return nil, reject(RejectUnknownType, "labelled packet (this cluster uses no memberlist label)")
	}
	if !keys.encrypted {
		return buf, checkPlain(buf)
	}
	plain, err := keys.open(buf, nil)
	if err == nil {
		return plain, checkPlain(plain)
	}
	// A well-formed plaintext packet is one: unless it begins with 0 or 1,
	// the encryption versions, which a ping (0) without checksum shares.
	if len(buf) > 0 && buf[0] > 1 && checkPlain(buf) == nil {
		return nil, reject(RejectPlain, "plaintext packet in an encrypted cluster")
	}
	return nil, reject(RejectDecrypt, "packet: %v", err)
}

// checkPlain checks a plaintext packet: an optional checksum, then a
// message.
func checkPlain(buf []byte) *rejection {
	if len(buf) >= 5 && buf[0] == mlHasCrc {
		if crc32.ChecksumIEEE(buf[5:]) != binary.BigEndian.Uint32(buf[1:5]) {
			return reject(RejectMalformed, "packet with a wrong checksum")
		}
		buf = buf[5:]
	}
	return checkCommand(buf, 0)
}

// checkCommand checks one message as handleCommand dispatches it.
func checkCommand(buf []byte, depth int) *rejection {
	if len(buf) == 0 {
		return reject(RejectMalformed, "message without a type")
	}
	switch buf[0] {
	case mlPing, mlIndirectPing, mlAckResp, mlNackResp, mlSuspect, mlAlive, mlDead, mlUser:
		return nil
	case mlCompress:
		return reject(RejectCompressed, "compressed message of %d bytes", len(buf))
	case mlCompound:
		if depth >= mlMaxCompoundDepth {
			return reject(RejectMalformed, "compound messages nested %d deep", depth+1)
		}
		parts, err := splitCompound(buf[1:])
		if err != nil {
			return reject(RejectMalformed, "compound message: %v", err)
		}
		for _, p := range parts {
			if r := checkCommand(p, depth+1); r != nil {
				return r
			}
		}
		return nil
	}
	return reject(RejectUnknownType, "message type %d", buf[0])
}

// splitCompound splits a compound message as memberlist's
// decodeCompoundMessage does (util.go): count(1) lengths(2 each) parts.
// A truncated one is refused whole (memberlist would log it, and take the
// parts before the cut).
func splitCompound(buf []byte) ([][]byte, error) {
	if len(buf) < 1 {
		return nil, errors.New("no part count")
	}
	n := int(buf[0])
	buf = buf[1:]
	if len(buf) < 2*n {
		return nil, errors.New("truncated part lengths")
	}
	lens, buf := buf[:2*n], buf[2*n:]
	parts := make([][]byte, n)
	for i := range parts {
		l := int(binary.BigEndian.Uint16(lens[2*i:]))
		if len(buf) < l {
			return nil, fmt.Errorf("part %d of %d truncated", i+1, n)
		}
		parts[i], buf = buf[:l], buf[l:]
	}
	return parts, nil
}

// requestTypes are the message types memberlist takes on an accepted
// stream (after decryption): handleConn takes user, push/pull and ping
// messages, and logs any other as an ERROR. answerTypes are those it reads
// on a stream it dialed: a push/pull answer, an ack or an error.
var (
	requestTypes = map[byte]bool{mlUser: true, mlPushPull: true, mlPing: true}
	answerTypes  = map[byte]bool{mlPushPull: true, mlAckResp: true, mlErr: true}
)

// checkStreamType checks the type of a stream's (decrypted) message
// against types, as readStream and handleConn or memberlist's dialers do.
// Like datagrams, compressed streams are refused: readStream would inflate
// one up to 40 MiB.
func checkStreamType(t byte, types map[byte]bool) *rejection {
	switch {
	case t == mlCompress:
		return reject(RejectCompressed, "compressed stream")
	case t == mlHasLabel:
		return reject(RejectUnknownType, "labelled stream (this cluster uses no memberlist label)")
	case !types[t]:
		return reject(RejectUnknownType, "stream of message type %d", t)
	}
	return nil
}

// gcms caches the AES-GCM of each key used (string(key) → cipher.AEAD):
// building one is most of the cost of a gossip message's decryption. The
// standard library's AES-GCM keeps no state between calls, so one serves
// every goroutine.
var gcms sync.Map

func gcmFor(key []byte) (cipher.AEAD, error) {
	if g, ok := gcms.Load(string(key)); ok {
		return g.(cipher.AEAD), nil
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	gcms.Store(string(key), g)
	return g, nil
}

// openPayload decrypts what memberlist's encryptPayload made (security.go)
// into a new slice, and refuses what memberlist's own decryption would
// choke on: a version-0 plaintext whose padding is not PKCS7 (pkcs7decode
// slices with it unchecked) or that is empty.
func openPayload(key, msg, aad []byte) ([]byte, error) {
	if len(msg) < 1+mlNonceSize+mlTagSize {
		return nil, fmt.Errorf("%d bytes are too few to decrypt", len(msg))
	}
	if msg[0] > 1 {
		return nil, fmt.Errorf("unknown encryption version %d", msg[0])
	}
	gcm, err := gcmFor(key)
	if err != nil {
		return nil, err
	}
	plain, err := gcm.Open(nil, msg[1:1+mlNonceSize], msg[1+mlNonceSize:], aad)
	if err != nil {
		return nil, errors.New("not encrypted with the cluster key")
	}
	if msg[0] == 0 {
		if len(plain) == 0 || int(plain[len(plain)-1]) > len(plain) || plain[len(plain)-1] == 0 {
			return nil, errors.New("bad padding")
		}
		plain = plain[:len(plain)-int(plain[len(plain)-1])]
	}
	if len(plain) == 0 {
		return nil, errors.New("empty payload")
	}
	return plain, nil
}
