package gossip

// Broadcasts between containers: sent from one, counted in the others.

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

const bcastPort = 5300

// udpReceiver collects datagrams on port in a container (IPv4 or IPv6
// wildcard address).
type udpReceiver struct {
	conn net.PacketConn
	mu   sync.Mutex
	got  map[string]bool
	done chan struct{}
}

func listenUDP(ctr *testbed.Container, fam testbed.Family, port int) (*udpReceiver, error) {
	network, addr := "udp4", fmt.Sprintf("0.0.0.0:%d", port)
	if fam == testbed.IPv6 {
		network, addr = "udp6", fmt.Sprintf("[::]:%d", port)
	}
	r := &udpReceiver{got: map[string]bool{}, done: make(chan struct{})}
	err := ctr.Do(func() error {
		var err error
		r.conn, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in %s: %w", network, addr, ctr.Name, err)
	}
	go func() {
		defer close(r.done)
		buf := make([]byte, 2048)
		for {
			k, _, err := r.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.got[string(buf[:k])] = true
			r.mu.Unlock()
		}
	}()
	return r, nil
}

func (r *udpReceiver) has(token string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[token]
}

func (r *udpReceiver) Close() {
	r.conn.Close()
	<-r.done
}

// sendBroadcast sends token from the container's eth0 to the IPv4 limited
// broadcast address, or to the IPv6 all-nodes group ff02::1, on port.
func sendBroadcast(ctr *testbed.Container, fam testbed.Family, port int, token string) error {
	var conn net.PacketConn
	err := ctr.Do(func() error {
		lc := net.ListenConfig{Control: func(network, address string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				// Bound to the device, a limited broadcast or a link-local
				// multicast needs no route and no zone (a zone name would be
				// resolved in this process's own namespace).
				if serr = syscall.BindToDevice(int(fd), ctr.Iface); serr != nil {
					return
				}
				if fam == testbed.IPv4 {
					serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1)
				}
			})
			return cmp.Or(err, serr)
		}}
		network, laddr := "udp4", "0.0.0.0:0"
		if fam == testbed.IPv6 {
			network, laddr = "udp6", "[::]:0"
		}
		var err error
		conn, err = lc.ListenPacket(context.Background(), network, laddr)
		return err
	})
	if err != nil {
		return fmt.Errorf("broadcast socket in %s: %w", ctr.Name, err)
	}
	defer conn.Close()
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: port}
	if fam == testbed.IPv6 {
		dst = &net.UDPAddr{IP: net.ParseIP("ff02::1"), Port: port}
	}
	_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.WriteTo([]byte(token), dst); err != nil {
		return fmt.Errorf("send to %s from %s: %w", dst, ctr.Name, err)
	}
	return nil
}

// broadcastReach sends broadcasts (IPv4 limited broadcast, IPv6 all-nodes
// multicast) from every container and reports which others received them.
// With want, it first retries for a bounded time until every other
// container got one, then requires that three fresh ones each reach every
// other container; without want, it requires that none of three
// broadcasts, over 0.8 s, reaches another host.
func (c *gcluster) broadcastReach(eps []*testbed.Endpoint, want bool) {
	c.t.Helper()
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		port := bcastPort + int(fam)
		rx := map[*testbed.Endpoint]*udpReceiver{}
		for _, ep := range eps {
			r, err := listenUDP(ep.Ctr, fam, port)
			if err != nil {
				c.t.Fatal(err)
			}
			rx[ep] = r
			defer r.Close()
		}
		for _, from := range eps {
			others := []*testbed.Endpoint{}
			for _, ep := range eps {
				if ep != from {
					others = append(others, ep)
				}
			}
			missing := func(token string) []string {
				var m []string
				for _, o := range others {
					if !rx[o].has(token) {
						m = append(m, o.String())
					}
				}
				return m
			}
			send := func(token string) {
				if err := sendBroadcast(from.Ctr, fam, port, token); err != nil {
					c.fatalf("%v", err)
				}
			}
			// sendSoon retries a send that fails, for a bounded time: a
			// freshly attached interface may still lack its IPv6
			// multicast route ("network is unreachable").
			sendSoon := func(token string, deadline time.Time) {
				for {
					err := sendBroadcast(from.Ctr, fam, port, token)
					if err == nil {
						return
					}
					if time.Now().After(deadline) {
						c.fatalf("%v (retried for 5s)", err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			if !want {
				token := fmt.Sprintf("nobcast-%v-%s-%s", fam, from, testbed.RandomHex(8))
				sendSoon(token, time.Now().Add(5*time.Second))
				for range 2 {
					time.Sleep(200 * time.Millisecond)
					send(token)
				}
				time.Sleep(200 * time.Millisecond)
				if m := missing(token); len(m) != len(others) {
					c.fatalf("%v broadcast from %s reached other hosts on a network without flood (received by all but %v)", fam, from, m)
				}
				continue
			}
			// Bounded wait for the first one to get through everywhere.
			token := fmt.Sprintf("bcast-%v-%s-%s", fam, from, testbed.RandomHex(8))
			deadline := time.Now().Add(5 * time.Second)
			for {
				sendSoon(token, deadline)
				time.Sleep(100 * time.Millisecond)
				if len(missing(token)) == 0 {
					break
				}
				if time.Now().After(deadline) {
					c.fatalf("%v broadcast from %s not received by %v within 5s", fam, from, missing(token))
				}
			}
			// Strict: every later one reaches everyone.
			for i := range 3 {
				tok := fmt.Sprintf("%s-%d", token, i)
				send(tok)
				wait := time.Now().Add(time.Second)
				for len(missing(tok)) > 0 && time.Now().Before(wait) {
					time.Sleep(20 * time.Millisecond)
				}
				if m := missing(tok); len(m) > 0 {
					c.fatalf("%v broadcast %d from %s (after the first got through) not received by %v", fam, i, from, m)
				}
			}
		}
	}
	if want {
		c.t.Logf("IPv4 broadcast and IPv6 all-nodes multicast from each of %v reach all the others", eps)
	} else {
		c.t.Logf("IPv4 broadcast and IPv6 all-nodes multicast stay on their host without flood (as documented)")
	}
}
