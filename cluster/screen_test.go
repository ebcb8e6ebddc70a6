package cluster

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// fakeTransport is the transport under a screen: the test plays the
// network on its channels and the remote end of its dials.
type fakeTransport struct {
	packets chan *memberlist.Packet
	streams chan net.Conn
	remote  chan net.Conn // the far end of each dial
}

func newFakeTransport() *fakeTransport {
	return &fakeTransport{packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), remote: make(chan net.Conn, 1)}
}

func (f *fakeTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return net.IPv4(127, 0, 0, 1), 7947, nil
}
func (f *fakeTransport) WriteTo([]byte, string) (time.Time, error) { return time.Now(), nil }
func (f *fakeTransport) WriteToAddress([]byte, memberlist.Address) (time.Time, error) {
	return time.Now(), nil
}
func (f *fakeTransport) PacketCh() <-chan *memberlist.Packet { return f.packets }
func (f *fakeTransport) StreamCh() <-chan net.Conn           { return f.streams }
func (f *fakeTransport) Shutdown() error                     { return nil }
func (f *fakeTransport) DialTimeout(a string, d time.Duration) (net.Conn, error) {
	return f.DialAddressTimeout(memberlist.Address{Addr: a}, d)
}
func (f *fakeTransport) DialAddressTimeout(memberlist.Address, time.Duration) (net.Conn, error) {
	near, far := net.Pipe()
	f.remote <- far
	return near, nil
}

var attacker = &net.UDPAddr{IP: net.IPv4(203, 0, 113, 66), Port: 7947}

// refusals records a screen's reports.
type refusals struct {
	mu sync.Mutex // guards n; a leaf lock
	n  [numReasons]int
}

func (r *refusals) refuse(_ string, _ net.Addr, rej *rejection) {
	r.mu.Lock()
	r.n[rej.reason]++
	r.mu.Unlock()
}

func (r *refusals) get(reason Reason) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// wait waits up to 5 s until n refusals of reason were counted.
func (r *refusals) wait(t *testing.T, reason Reason, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.get(reason) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%v refusals: %d, want %d", reason, r.get(reason), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// readAll reads what memberlist would read from a stream, in small reads,
// and closes it, as memberlist does.
func readAll(c net.Conn) []byte {
	defer c.Close()
	var out []byte
	buf := make([]byte, 7)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out
		}
	}
}

// The bomb of issue 12 reaches memberlist in no form: not as a datagram,
// not as a stream it accepts or dials, not inside the encryption. So
// memberlist decompresses none of it, where it inflated 31 KB into 40 MiB.
func TestScreenHandsMemberlistNoBomb(t *testing.T) {
	bomb := lzwBomb(t)
	for _, key := range [][]byte{nil, testKey} {
		name := map[bool]string{true: "encrypted", false: "plaintext"}[key != nil]
		t.Run(name, func(t *testing.T) {
			ft, rs := newFakeTransport(), &refusals{}
			g := newScreenTransport(ft, newKeyring(key), rs.refuse, nil)
			defer g.Shutdown()
			wrap := func(msg []byte) []byte {
				if key != nil {
					return seal(t, key, msg, nil)
				}
				return msg
			}
			frame := func(msg []byte) []byte {
				if key != nil {
					return sealStream(t, key, msg)
				}
				return msg
			}

			// Datagrams: the bomb, plain and behind a checksum and in a
			// compound, then a ping: the ping is the first thing through.
			for _, b := range [][]byte{bomb, withCRC(bomb), compound(ping, bomb[:30000])} {
				ft.packets <- &memberlist.Packet{Buf: wrap(b), From: attacker}
			}
			// memberlist gets it decrypted: it does not decrypt again.
			ft.packets <- &memberlist.Packet{Buf: wrap(withCRC(ping)), From: attacker}
			if p := <-g.PacketCh(); !bytes.Equal(p.Buf, withCRC(ping)) {
				t.Fatalf("memberlist was handed %d bytes, not the ping", len(p.Buf))
			}
			if n := rs.get(RejectCompressed); n != 3 {
				t.Fatalf("%d compressed datagrams refused, want 3", n)
			}

			// An accepted stream carrying the bomb never reaches
			// memberlist, a dialed one reads as empty; a good stream reads
			// as it was sent, decrypted.
			near, far := net.Pipe()
			go func() { far.Write(frame(bomb)); far.Close() }()
			ft.streams <- near
			rs.wait(t, RejectCompressed, 4)
			conn, err := g.DialAddressTimeout(memberlist.Address{Addr: "203.0.113.66:7947"}, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			go func() { r := <-ft.remote; r.Write(frame(bomb)); r.Close() }()
			if got := readAll(conn); len(got) != 0 {
				t.Fatalf("memberlist read %d bytes of a compressed answer", len(got))
			}
			if n := rs.get(RejectCompressed); n != 5 {
				t.Fatalf("%d compressed inputs refused, want 5", n)
			}
			user := plainUser(t, bytes.Repeat([]byte{0x42}, 5000))
			near2, far2 := net.Pipe()
			go func() { far2.Write(frame(user)); far2.Close() }()
			ft.streams <- near2
			if got := readAll(<-g.StreamCh()); !bytes.Equal(got, user) {
				t.Fatalf("a good stream read back as %d bytes, sent %d", len(got), len(user))
			}
		})
	}
}

// The stream checks of an encrypted cluster: plaintext, another key.
func TestScreenStreamsOfAnEncryptedCluster(t *testing.T) {
	ft, rs := newFakeTransport(), &refusals{}
	g := newScreenTransport(ft, newKeyring(testKey), rs.refuse, nil)
	defer g.Shutdown()
	for _, c := range []struct {
		data []byte
		want Reason
	}{
		{[]byte{mlPushPull, 0x80}, RejectPlain},
		{sealStream(t, bytes.Repeat([]byte{8}, 32), []byte{mlUser, 1}), RejectDecrypt},
		{sealStream(t, testKey, []byte{99}), RejectUnknownType},
		{[]byte{mlEncrypt, 0xff, 0xff, 0xff, 0xff}, RejectMalformed},
		{[]byte{mlEncrypt, 0, 0}, RejectMalformed},
		{sealStream(t, testKey, []byte{mlUser, 1})[:30], RejectMalformed},
	} {
		near, far := net.Pipe()
		go func() { far.Write(c.data); far.Close() }()
		ft.streams <- near
		rs.wait(t, c.want, 1)
		select {
		case got := <-g.StreamCh():
			t.Errorf("stream %x: memberlist got it (%d bytes)", c.data[:1], len(readAll(got)))
		default:
		}
		rs.mu.Lock()
		rs.n = [numReasons]int{}
		rs.mu.Unlock()
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex // guards now; a leaf lock
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var suppressedRE = regexp.MustCompile(`suppressed=(\d+)`)

// logLines returns the lines of reason, and the sum of their suppressed
// counts.
func logLines(log string, reason Reason) (lines int, suppressed uint64) {
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "reason="+reason.String()) {
			continue
		}
		lines++
		if m := suppressedRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			suppressed += n
		}
	}
	return lines, suppressed
}

// 20,000 garbage datagrams make one log line per reason, then one per
// reason and interval that counts the rest; every one is counted.
func TestRefusalLogIsRateLimited(t *testing.T) {
	const n = 20000
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	var out logBuf
	lim := newLogLimiter(clock.Now, rejectLogEvery)
	c := &Cluster{log: slog.New(rateHandler{slog.NewTextHandler(&out, nil), lim}), logLim: lim}
	ft := newFakeTransport()
	g := newScreenTransport(ft, newKeyring(nil), c.refuseInput, nil)
	defer g.Shutdown()
	garbage := [][]byte{{99}, {mlCompress, 1}, {mlCompound, 9}}
	reasons := []Reason{RejectUnknownType, RejectCompressed, RejectMalformed}
	for i := range n {
		ft.packets <- &memberlist.Packet{Buf: garbage[i%3], From: attacker}
	}
	wait.For(t, 5*time.Second, tick, "every datagram counted", func() error {
		if got := c.rej[RejectUnknownType].Load() + c.rej[RejectCompressed].Load() + c.rej[RejectMalformed].Load(); got != n {
			return fmt.Errorf("%d refusals counted, want %d", got, n)
		}
		return nil
	})
	for _, r := range reasons {
		if lines, _ := logLines(out.tail(n), r); lines != 1 {
			t.Errorf("%v: %d log lines for a burst, want 1", r, lines)
		}
	}
	clock.advance(rejectLogEvery)
	lim.flush()
	for _, r := range reasons {
		lines, suppressed := logLines(out.tail(n), r)
		if want := c.rej[r].Load() - 1; lines != 2 || suppressed != want {
			t.Errorf("%v: %d lines counting %d left out, want 2 counting %d", r, lines, suppressed, want)
		}
	}
	t.Logf("the log of %d refusals:\n%s", n, out.tail(10))
}

// Shutdown returns while datagrams keep arriving and nobody reads them:
// memberlist's NetTransport hands each one over an unbuffered channel and
// its Shutdown waits for that hand-over, so a screen that stopped reading
// first held the plugin's SIGTERM until it was killed.
func TestScreenShutdownWhileDatagramsArrive(t *testing.T) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"},
		Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	g := newScreenTransport(nt, newKeyring(nil), (&refusals{}).refuse, nil)
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: nt.GetAutoBindPort()}
	conn, err := net.DialUDP("udp", nil, to)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ping := []byte{mlUser, 1} // a message the screen passes on
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			select {
			case <-stop:
				return
			default:
				conn.Write(ping)
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); <-sent }()
	time.Sleep(50 * time.Millisecond) // the screen holds one, the transport the next
	done := make(chan error, 1)
	go func() { done <- g.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown still waiting after 5 s while datagrams arrive")
	}
}

// A peer that writes its message and closes at once (memberlist's
// SendReliable does) leaves a stream whose head the screen read ahead;
// memberlist must still get it, set its deadline and read it whole,
// although net.Pipe, like some conns, refuses deadlines once the peer is
// gone. (Dropped once: every anti-entropy message was lost in tests.)
func TestScreenPassesAStreamWhosePeerClosed(t *testing.T) {
	ft, rs := newFakeTransport(), &refusals{}
	g := newScreenTransport(ft, newKeyring(testKey), rs.refuse, nil)
	defer g.Shutdown()
	// In an encrypted cluster the check reads the whole first message,
	// and memberlist gets it decrypted.
	user := append([]byte{mlUser}, bytes.Repeat([]byte{0x42}, 40)...)
	near, far := net.Pipe()
	done := make(chan struct{})
	go func() { far.Write(sealStream(t, testKey, user)); far.Close(); close(done) }()
	ft.streams <- near
	got := <-g.StreamCh()
	<-done
	if err := got.SetDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatalf("memberlist's deadline on a stream read ahead: %v", err)
	}
	if b := readAll(got); !bytes.Equal(b, user) {
		t.Fatalf("read back %d bytes, sent %d", len(b), len(user))
	}
}

// Without a key, an accepted stream also reaches memberlist only with its
// whole first message in: not one that sends a type byte and stops (it
// held one of memberlist's goroutines for its 10 s, past every bound),
// not one of a type memberlist only reads on a stream it dialed (it logged
// an ERROR line each). A dialed stream may answer with those.
func TestScreenAcceptedPlaintextStreams(t *testing.T) {
	ft, rs := newFakeTransport(), &refusals{}
	g := newScreenTransport(ft, newKeyring(nil), rs.refuse, nil)
	g.headWait = 200 * time.Millisecond
	defer g.Shutdown()
	send := func(data []byte, hold bool) {
		near, far := net.Pipe()
		go func() {
			far.Write(data)
			if !hold {
				far.Close()
			}
		}()
		t.Cleanup(func() { far.Close() })
		ft.streams <- near
	}
	send([]byte{mlAckResp}, false)
	send([]byte{mlErr}, false)
	rs.wait(t, RejectUnknownType, 2)
	for _, typ := range []byte{mlUser, mlPushPull, mlPing} {
		send([]byte{typ}, true)
	}
	send(plainUser(t, make([]byte, 1000))[:500], true)
	rs.wait(t, RejectStreamIdle, 4)
	select {
	case c := <-g.StreamCh():
		t.Fatalf("memberlist got a stream: %x", readAll(c))
	default:
	}
	pp := testPushPull(t, bytes.Repeat([]byte{1}, 3000))
	send(pp, false)
	if got := readAll(<-g.StreamCh()); !bytes.Equal(got, pp) {
		t.Fatalf("a push/pull read back as %d bytes, sent %d", len(got), len(pp))
	}
	conn, err := g.DialAddressTimeout(memberlist.Address{Addr: "203.0.113.66:7947"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ack := plainStream(mlAckResp, msgpack(t, map[string]any{"SeqNo": 1, "Payload": nil}))
	go func() { r := <-ft.remote; r.Write(ack); r.Close() }()
	if got := readAll(conn); !bytes.Equal(got, ack) {
		t.Fatalf("an ack answer read back as %x, sent %x", got, ack)
	}
	if n := rs.get(RejectUnknownType) + rs.get(RejectMalformed); n != 2 {
		t.Errorf("%d streams refused as of an unknown type or malformed, want 2", n)
	}
}
