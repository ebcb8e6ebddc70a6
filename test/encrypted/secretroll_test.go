package encrypted

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// 5e. The cluster secret rolled in the README's three steps under traffic.

// tcpStreamPort is the port of the long-lived TCP stream of the roll.
const tcpStreamPort = 7002

// secretsView is the part of `overlay-plugin cluster` the roll reads.
type secretsView struct {
	Secrets encryption.SecretsStatus `json:"secrets"`
}

func (s *suite) secretsOf(n *testbed.Node) (secretsView, error) {
	var v secretsView
	err := n.Plugin.AdminJSON("/v1/cluster", &v)
	return v, err
}

// phaseSecretRoll: sequenced UDP streams (c1->c2, c3->c1, every 50 ms) and
// an established TCP connection (c2->c3, a numbered block every 50 ms,
// echoed back) run while every host's secret file goes through the three
// steps, each host changed in turn and read with `overlay-plugin reload`.
// Nothing may be lost, the TCP connection must carry every byte, and at
// the end every pair's IPsec is keyed with the new secret: `overlay-plugin
// cluster` says so, and `ip xfrm state` holds other SPIs than before.
func (s *suite) phaseSecretRoll(t *testing.T) {
	// The hosts' key generations go on rotating (every minute here, each
	// host on its own schedule) through the roll: it must lose nothing
	// across those too.
	var pre map[*testbed.Node]encryption.Status
	wait.For(t, keyRotation+lead+grace, poll, "SAs settled before the roll", func() error {
		var err error
		pre, err = s.steady()
		return err
	})
	spisBefore := map[*testbed.Node][]uint32{}
	for _, n := range s.Nodes {
		spisBefore[n] = kernelSPIs(t, n)
	}
	counters0 := s.readIPsecCounters(t)
	stopUDP := s.startStreams(t)
	defer stopUDP()
	c2, c3 := s.ep("c2"), s.ep("c3")
	tcp, err := startTCPStream(c2.Ctr.Netns, c3.Ctr.Netns, netip.AddrPortFrom(c3.addr(testbed.IPv4), tcpStreamPort), streamEvery)
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.stop()

	data, err := os.ReadFile(s.Nodes[0].SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	old, _, err := encryption.ParseSecrets(data)
	if err != nil || len(old) != 1 {
		t.Fatalf("the secret file before the roll: %d secrets, %v", len(old), err)
	}
	oldLine := strings.TrimSpace(string(data))
	newLine := testbed.SecretLine()
	fresh, _, err := encryption.ParseSecrets([]byte(newLine))
	if err != nil {
		t.Fatal(err)
	}
	oldID, newID := old[0].ID, fresh[0].ID
	t.Logf("rolling the cluster secret from %s to %s", oldID, newID)

	rollStart := time.Now()
	stepOn := func(step string, lines ...string) {
		t.Helper()
		start := time.Now()
		for _, n := range s.Nodes {
			if err := os.WriteFile(n.SecretFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := s.cli(n, "reload"); err != nil {
				t.Fatalf("%s: %s: overlay-plugin reload: %v: %s", step, n.Name, err, out)
			}
		}
		t.Logf("%s: every host reloaded in %v", step, time.Since(start).Round(time.Millisecond))
	}
	everyMember := func(step string, ok func(held []string, pair string) bool) {
		t.Helper()
		start := time.Now()
		wait.For(t, converge, poll, step, func() error {
			for _, n := range s.Nodes {
				v, err := s.secretsOf(n)
				if err != nil {
					return err
				}
				if len(v.Secrets.Members) != len(s.Nodes)-1 {
					return fmt.Errorf("%s lists %d members", n.Name, len(v.Secrets.Members))
				}
				for _, m := range v.Secrets.Members {
					if !ok(m.Secrets, m.PairSecret) {
						return fmt.Errorf("%s sees %s hold %v, pair secret %q", n.Name, m.Name, m.Secrets, m.PairSecret)
					}
				}
			}
			return nil
		})
		t.Logf("%s: seen on every host after %v", step, time.Since(start).Round(time.Millisecond))
		time.Sleep(3 * time.Second) // traffic between the steps, as an operator's pause
	}

	stepOn("1: new secret second", oldLine, newLine)
	everyMember("every member holds the new secret", func(held []string, pair string) bool {
		return slices.Equal(held, []string{oldID, newID}) && pair == oldID
	})
	stepOn("2: new secret first", newLine, oldLine)
	everyMember("every pair keyed with the new secret", func(held []string, pair string) bool {
		return slices.Equal(held, []string{newID, oldID}) && pair == newID
	})
	stepOn("3: old secret removed", newLine)
	everyMember("every member holds the new secret alone", func(held []string, pair string) bool {
		return slices.Equal(held, []string{newID}) && pair == newID
	})
	t.Logf("the roll took %v", time.Since(rollStart).Round(time.Millisecond))

	// Settled: one inbound and one outbound SA per remote, new SPIs only.
	var post map[*testbed.Node]encryption.Status
	wait.For(t, converge, poll, "SAs settled after the roll", func() error {
		var err error
		post, err = s.steady()
		return err
	})
	for _, n := range s.Nodes {
		after := kernelSPIs(t, n)
		sameGens := slices.Equal(genOf(pre[n]), genOf(post[n]))
		t.Logf("%s: ip xfrm state SPIs %08x -> %08x (key generations rotated meanwhile: %v)", n.Name, spisBefore[n], after, !sameGens)
		for _, spi := range after {
			if slices.Contains(spisBefore[n], spi) {
				t.Errorf("%s: SPI %08x of the old secret still installed", n.Name, spi)
			}
		}
	}

	time.Sleep(2 * time.Second) // traffic on the new SAs alone
	sent, err := tcp.stop()
	if err != nil {
		t.Errorf("TCP stream c2->c3 across the roll: %v", err)
	}
	t.Logf("TCP stream c2->c3: %d bytes sent and echoed back intact over one connection", sent)
	for _, r := range stopUDP() {
		t.Logf("%s", r)
		if !r.Lossless() {
			t.Errorf("packets lost or duplicated across the roll: %s", r)
		}
	}
	s.checkNoIPsecErrors(t, counters0, "the roll")
}

// kernelSPIs lists the SPIs `ip xfrm state` shows in n, sorted.
func kernelSPIs(t *testing.T, n *testbed.Node) []uint32 {
	t.Helper()
	states, out, err := n.NS.XfrmStates()
	if err != nil {
		t.Fatalf("%s: ip xfrm state: %v\n%s", n.Name, err, out)
	}
	var spis []uint32
	for _, st := range states {
		spis = append(spis, st.SPI)
	}
	slices.Sort(spis)
	return spis
}

// genOf lists a status's own and remote generations.
func genOf(st encryption.Status) []uint64 {
	var out []uint64
	for _, g := range st.Own {
		out = append(out, g.Gen)
	}
	for _, r := range st.Remotes {
		for _, g := range r.Generations {
			out = append(out, g.Gen)
		}
	}
	return out
}

// tcpStream is one TCP connection that carries a numbered block every
// interval to an echo server and reads it back: every byte must return, in
// order, over the same connection.
type tcpStream struct {
	conn     net.Conn
	l        net.Listener
	interval time.Duration
	done     chan struct{}
	wg       sync.WaitGroup

	mu     sync.Mutex
	sent   uint64
	echoed uint64
	err    error
}

const tcpBlock = 1024

func block(seq uint64) []byte {
	b := bytes.Repeat([]byte{byte(seq)}, tcpBlock)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

func startTCPStream(fromNS, toNS *testbed.Netns, to netip.AddrPort, interval time.Duration) (*tcpStream, error) {
	l, err := toNS.Listen(to)
	if err != nil {
		return nil, err
	}
	s := &tcpStream{l: l, interval: interval, done: make(chan struct{})}
	s.wg.Add(1)
	go func() { // the echo side: one connection, no deadline
		defer s.wg.Done()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	if s.conn, err = fromNS.Dial(to, 30*time.Second); err != nil {
		l.Close()
		return nil, err
	}
	s.wg.Add(2)
	go s.write()
	go s.read()
	return s, nil
}

func (s *tcpStream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *tcpStream) write() {
	defer s.wg.Done()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for seq := uint64(0); ; seq++ {
		select {
		case <-s.done:
			if err := s.conn.(*net.TCPConn).CloseWrite(); err != nil {
				s.fail(err)
			}
			return
		case <-t.C:
		}
		if _, err := s.conn.Write(block(seq)); err != nil {
			s.fail(fmt.Errorf("write block %d: %w", seq, err))
			return
		}
		s.mu.Lock()
		s.sent += tcpBlock
		s.mu.Unlock()
	}
}

func (s *tcpStream) read() {
	defer s.wg.Done()
	buf := make([]byte, tcpBlock)
	for seq := uint64(0); ; seq++ {
		if _, err := io.ReadFull(s.conn, buf); err != nil {
			if err != io.EOF {
				s.fail(fmt.Errorf("read block %d: %w", seq, err))
			}
			return
		}
		if !bytes.Equal(buf, block(seq)) {
			s.fail(fmt.Errorf("block %d came back altered", seq))
			return
		}
		s.mu.Lock()
		s.echoed += tcpBlock
		s.mu.Unlock()
	}
}

// stop ends the stream (once the echo drained, or after a bound) and
// returns the bytes sent, and an error unless all came back.
func (s *tcpStream) stop() (uint64, error) {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	finished := make(chan struct{})
	go func() { s.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		s.conn.Close()
		<-finished
	}
	s.conn.Close()
	s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && s.echoed != s.sent {
		s.err = fmt.Errorf("%d bytes sent, %d echoed", s.sent, s.echoed)
	}
	if s.sent == 0 && s.err == nil {
		s.err = fmt.Errorf("nothing sent")
	}
	return s.sent, s.err
}
