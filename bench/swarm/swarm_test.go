package swarm

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// The measuring parts on loopback in the test's own network namespace
// (entering it needs root, as the figures do).
const ownNS = "/proc/self/ns/net"

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setns needs root")
	}
}

func TestTCPRunCountsEveryByte(t *testing.T) {
	needRoot(t)
	for _, n := range []int{1, 4} {
		res := tcpRun(ownNS, ownNS, netip.MustParseAddrPort("127.0.0.1:25201"), n, 300*time.Millisecond)
		if !res.Correct || res.Error != "" || len(res.Streams) != n || res.Gbps <= 0 {
			t.Fatalf("%d streams: %+v", n, res)
		}
		for i, s := range res.Streams {
			if s.Sent == 0 || s.Sent != s.Received {
				t.Errorf("%d streams: stream %d: %+v", n, i, s)
			}
		}
	}
}

func TestConnectLoopWaitsForTheListener(t *testing.T) {
	needRoot(t)
	dst := netip.MustParseAddrPort("127.0.0.1:25202")
	p, err := startProbe(ownNS, dst, 5*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(200 * time.Millisecond)
	ln, err := net.Listen("tcp4", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	up := time.Now()
	res := <-p.done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.at.Before(up) || res.at.Sub(up) > 100*time.Millisecond {
		t.Errorf("connected %v after the listener (%v after the start), want within 100ms", res.at.Sub(up), res.at.Sub(t0))
	}
	if res.attempts < 20 {
		t.Errorf("%d attempts in 200 ms at 5 ms", res.attempts)
	}
}

func TestConnectLoopGivesUp(t *testing.T) {
	needRoot(t)
	p, err := startProbe(ownNS, netip.MustParseAddrPort("127.0.0.1:25203"), 10*time.Millisecond, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res := <-p.done; res.err == nil {
		t.Fatal("connected to nothing")
	}
}
