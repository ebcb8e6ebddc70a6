package gossip

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

const vipPort = 8080

// nameServer answers each connection with the backend's name, then echoes.
func nameServer(t *testing.T, ep *testbed.Endpoint) {
	t.Helper()
	if _, err := ep.Ctr.StartGreetingEcho(netip.AddrPortFrom(netip.IPv4Unspecified(), vipPort), ep.Ctr.Name); err != nil {
		t.Fatal(err)
	}
}

// ask connects from client to addr and returns the name the backend gave,
// and the connection, open.
func ask(client *testbed.Endpoint, addr netip.AddrPort) (string, net.Conn, error) {
	c, err := client.Ctr.Dial(addr, 2*time.Second)
	if err != nil {
		return "", nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	name, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return "", nil, err
	}
	return strings.TrimSpace(name), c, nil
}

// spread makes n connections from client to addr and counts the backends
// that answered.
func spread(client *testbed.Endpoint, addr netip.AddrPort, n int) (map[string]int, error) {
	got := map[string]int{}
	for range n {
		name, c, err := ask(client, addr)
		if err != nil {
			return got, err
		}
		c.Close()
		got[name]++
	}
	return got, nil
}

// A service's VIP on a plugin network: connections from containers on both
// hosts go to all of its tasks, follow the tasks as they come and go
// (within a second of the plugin's gossip), never reach a task that left,
// fail at once with no task, and leave no rule when the service goes.
func TestServiceVIP(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Hosts: 2}, engines: true})
	h1, h2 := c.Nodes[0], c.Nodes[1]
	b1, b2, b3 := c.addContainer(h1, "b1"), c.addContainer(h1, "b2"), c.addContainer(h2, "b3")
	c1, c2 := c.addContainer(h1, "c1"), c.addContainer(h2, "c2")
	c.waitConverged(converge, "backends and clients")
	for _, b := range []*testbed.Endpoint{b1, b2, b3} {
		nameServer(t, b)
	}
	vip := netip.AddrPortFrom(testbed.Nth(overlay.Pool4, 200), vipPort)
	setAll := func(tasks ...*testbed.Endpoint) {
		for _, e := range c.engines {
			setService(e, c.nw.ID, "web", vip.Addr().String(), tasks...)
		}
	}
	setAll(b1, b2, b3)

	// Docker listed the service without an endpoint change: the periodic
	// refresh picks it up.
	for _, cl := range []*testbed.Endpoint{c1, c2} {
		deadline := time.Now().Add(8 * time.Second)
		for {
			if _, conn, err := ask(cl, vip); err == nil {
				conn.Close()
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: the VIP %s does not answer 8 s after Docker listed the service: %v", cl.Ctr.Name, vip, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, cl := range []*testbed.Endpoint{c1, c2} {
		got, err := spread(cl, vip, 60)
		if err != nil {
			t.Fatalf("%s: %v (so far %v)", cl.Ctr.Name, err, got)
		}
		t.Logf("%s: 60 connections to %s: %v", cl.Ctr.Name, vip, got)
		for _, b := range []string{"b1", "b2", "b3"} {
			if got[b] == 0 {
				t.Errorf("%s: no connection reached %s: %v", cl.Ctr.Name, b, got)
			}
		}
	}
	st, err := h1.Plugin.Network(c.nw.ID)
	if err != nil {
		t.Fatal(err)
	}
	var counted uint64
	for _, s := range st.Services {
		for _, b := range s.Backends {
			counted += b.Connections
		}
	}
	if len(st.Services) != 1 || len(st.Services[0].Backends) != 3 || counted < 60 {
		t.Errorf("h1's state shows services %+v (%d connections counted), want web with 3 backends and at least c1's 60 connections", st.Services, counted)
	}

	// A task starts on h2: within a second of the gossip, connections
	// reach it.
	b4 := c.addContainer(h2, "b4")
	nameServer(t, b4)
	setAll(b1, b2, b3, b4)
	start := time.Now()
	for {
		got, err := spread(c1, vip, 20)
		if err != nil {
			t.Fatal(err)
		}
		if got["b4"] > 0 {
			t.Logf("a new task was used %v after it joined", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("the new task b4 got no connection %v after it joined: %v", time.Since(start), got)
		}
	}

	// Open streams to b2 and b3, then b1 leaves: the streams go on, and
	// no new connection reaches b1.
	open := map[string]net.Conn{}
	for i := 0; len(open) < 2 && i < 100; i++ {
		name, conn, err := ask(c1, vip)
		if err != nil {
			t.Fatal(err)
		}
		if (name == "b2" || name == "b3") && open[name] == nil {
			open[name] = conn
		} else {
			conn.Close()
		}
	}
	if len(open) < 2 {
		t.Fatalf("100 connections did not reach both b2 and b3")
	}
	c.leave(b1)
	setAll(b2, b3, b4)
	time.Sleep(time.Second)
	for _, cl := range []*testbed.Endpoint{c1, c2} {
		got, err := spread(cl, vip, 40)
		if err != nil {
			t.Fatal(err)
		}
		if got["b1"] > 0 {
			t.Errorf("%s: %d connections reached b1 a second after it left: %v", cl.Ctr.Name, got["b1"], got)
		}
	}
	for name, conn := range open {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		msg := "still there " + name + "\n"
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatalf("stream to %s after b1 left: %v", name, err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != msg {
			t.Fatalf("stream to %s after b1 left: read %q, %v", name, buf, err)
		}
		conn.Close()
	}

	// Scaled to zero: the VIP refuses at once rather than hang.
	for _, b := range []*testbed.Endpoint{b2, b3, b4} {
		c.leave(b)
	}
	setAll()
	time.Sleep(time.Second)
	start = time.Now()
	_, conn, err := ask(c1, vip)
	if err == nil {
		conn.Close()
		t.Fatal("the VIP of a service without tasks answered")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Errorf("the VIP of a service without tasks: %v after %v, want connection refused at once", err, time.Since(start))
	}

	// The service goes: within the refresh period the containers hold no
	// rule of it.
	for _, e := range c.engines {
		setService(e, c.nw.ID, "web", "")
	}
	deadline := time.Now().Add(8 * time.Second)
	for _, cl := range []*testbed.Endpoint{c1, c2} {
		for {
			tables, err := testbed.NftTables(cl.Ctr.Path())
			if err != nil {
				t.Fatalf("%s: %v", cl.Ctr.Name, err)
			}
			if !slices.ContainsFunc(tables, func(tb string) bool { return strings.Contains(tb, "overlay_plugin") }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still holds the plugin's table 8 s after the service was removed: %s", cl.Ctr.Name, tables)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}
