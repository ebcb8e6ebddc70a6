package cluster

import (
	"fmt"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestClosingSessionsDoesNotSpin: 50 nodes on loopback, each holding a
// channel with every other, close at once, within 4 s of CPU. It was
// written when channels were yamux streams: without the deadlines a dead
// session gives its streams (session.go), every blocked channel read spun
// until yamux marked its stream closed (11-12 s of CPU, against 0.7-0.8 s
// with them). Channels are connections of their own now; sessions carry
// memberlist's streams, which the same guard covers.
func TestClosingSessionsDoesNotSpin(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: 50 nodes on loopback")
	}
	if raceBuild {
		t.Skip("the race detector's overhead swamps the CPU figure; the plain run checks it")
	}
	const n = 50
	var cs []*Cluster
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	var seed []string
	for i := range n {
		ip := fmt.Sprintf("127.0.3.%d", i+1)
		c, err := New(Config{NodeName: fmt.Sprintf("n%d", i), BindAddr: ip, AdvertiseAddr: netip.MustParseAddr(ip),
			Sink: newRecSink(), Logger: testLogger(), Join: seed})
		if err != nil {
			t.Fatal(err)
		}
		c.NetworkAdded(netA)
		if seed == nil {
			seed = []string{fmt.Sprintf("%s:%d", ip, c.ml.LocalNode().Port)}
		}
		cs = append(cs, c)
	}
	waitFor(t, 30*time.Second, "every member", holds(func() bool { return aliveMembers(cs[n-1]) == n && aliveMembers(cs[0]) == n }))
	for i, c := range cs {
		c.Publish(netA, testPeer(fmt.Sprintf("e%d", i), i))
	}
	// Most pushes go by channel; a member that took another for a
	// stranger for a moment sends by plain connections for 30 s.
	waitFor(t, 30*time.Second, "channels open", holds(func() bool {
		k := 0
		for _, c := range cs {
			c.chMu.Lock()
			for _, pc := range c.channels {
				if pc.send != nil {
					k++
				}
			}
			c.chMu.Unlock()
		}
		return k >= n*(n-1)/2
	}))
	cpu0, t0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); c.Close() }()
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	t.Logf("closing %d nodes took %v, %v of CPU", n, time.Since(t0).Round(time.Millisecond), cpu.Round(time.Millisecond))
	if cpu > 4*time.Second {
		t.Errorf("closing %d nodes took %v of CPU, want at most 4s: blocked stream reads spun", n, cpu)
	}
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
