package cluster

import (
	"io"
	"log"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// silentListener returns a loopback TCP address whose connection attempts
// hang like those to a host that went away: a listener with a backlog of
// zero, never accepting, its one queue slot taken, so that the kernel
// drops further SYNs.
func silentListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr // the queue is full: SYNs go unanswered now
		}
		t.Cleanup(func() { c.Close() })
		if i == 8 {
			t.Fatal("the listener keeps accepting connections")
		}
	}
}

// A Close while memberlist dials a member that does not answer returns at
// once: it held the plugin's SIGTERM for memberlist's TCPTimeout (10 s),
// and the test harness killed the plugin.
func TestCloseDoesNotWaitForUnansweredDial(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: binds loopback sockets and waits for a dial")
	}
	seed := silentListener(t)
	c, err := New(Config{
		NodeName:      "n1",
		BindAddr:      "127.0.0.1",
		AdvertiseAddr: netip.MustParseAddr("127.0.0.1"),
		Join:          []string{seed},
		Sink:          newRecSink(),
		Logger:        testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The rejoin loop tries the seed at start: its push/pull dial hangs.
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	c.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v while a dial hung (memberlist's TCPTimeout is 10s)", d)
	}
}

// Streams leave from the advertised address, which the others tell
// members by (screen.go); one that is not this host's leaves the kernel's
// pick.
func TestStreamsLeaveFromTheAdvertisedAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: binds loopback sockets")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct{ adv, want string }{{"127.0.0.2", "127.0.0.2"}, {"203.0.113.7", "127.0.0.1"}} {
		mc := memberlist.DefaultLANConfig()
		mc.BindAddr, mc.BindPort, mc.AdvertiseAddr = "127.0.0.1", 0, c.adv
		mc.Logger = log.New(io.Discard, "", 0)
		tr, err := newAbortableTransport(t.Context(), mc)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tr.DialAddressTimeout(memberlist.Address{Addr: ln.Addr().String()}, time.Second)
		if err != nil {
			t.Fatalf("advertising %s: %v", c.adv, err)
		}
		in, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if got := in.RemoteAddr().(*net.TCPAddr).IP.String(); got != c.want {
			t.Errorf("advertising %s: the stream came from %s, want %s", c.adv, got, c.want)
		}
		in.Close()
		conn.Close()
		tr.Shutdown()
	}
}
