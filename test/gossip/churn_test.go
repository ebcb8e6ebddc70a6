package gossip

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// Hundreds of Join/Leave operations on the three hosts at once, addresses
// re-used across hosts, end with every host's tables holding exactly the
// live remote endpoints.
func testChurn(t *testing.T) {
	c := newCluster(t, options{ClusterConfig: testbed.ClusterConfig{Secret: true}})
	base := c.containerPerHost()
	c.waitConverged(converge, "initial")

	const (
		workersPerHost = 3
		iterations     = 30
		slots          = 60
		firstSlot      = 100
	)
	free := make(chan int, slots)
	for i := range slots {
		free <- firstSlot + i
	}
	var joins, leaves atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	errc := make(chan error, len(c.Nodes)*workersPerHost)
	var wg sync.WaitGroup
	// Watch the broadcast queues while the churn runs.
	maxQueued := make([]float64, len(c.Nodes))
	sampleStop := make(chan struct{})
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for {
			for i, n := range c.Nodes {
				if v, err := n.ClusterView(); err == nil {
					if q, ok := v.Stats["BroadcastsQueued"].(float64); ok {
						maxQueued[i] = max(maxQueued[i], q)
					}
				}
			}
			select {
			case <-sampleStop:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	for _, n := range c.Nodes {
		for w := range workersPerHost {
			wg.Go(func() {
				rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
				for i := range iterations {
					if ctx.Err() != nil {
						errc <- fmt.Errorf("%s worker %d: out of time at iteration %d", n.Name, w, i)
						return
					}
					slot := <-free
					ep, err := c.joinNoContainer(n, slot)
					if err != nil {
						errc <- err
						return
					}
					joins.Add(1)
					time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
					// The last endpoint of a worker stays with even odds.
					if i == iterations-1 && rng.IntN(2) == 0 {
						return
					}
					if err := c.leaveErr(ep); err != nil {
						errc <- err
						return
					}
					leaves.Add(1)
					free <- slot
				}
			})
		}
	}
	wg.Wait()
	close(sampleStop)
	<-sampleDone
	close(errc)
	for err := range errc {
		c.fatalf("churn: %v", err)
	}
	ops := joins.Load() + leaves.Load()
	t.Logf("churn: %d Join and %d Leave operations (with CreateEndpoint/DeleteEndpoint) by %d workers on %d hosts in %v; %d endpoints live",
		joins.Load(), leaves.Load(), workersPerHost*len(c.Nodes), len(c.Nodes), time.Since(start).Round(time.Millisecond), len(c.Live(c.nw)))
	if ops < 300 {
		t.Fatalf("churn ran only %d operations", ops)
	}
	t.Logf("churn: largest broadcast queue seen per host %v", maxQueued)
	// Broadcasts alone need not reach every host in a burst (memberlist
	// counts a transmission to any node towards a message's retransmit
	// limit); the periodic push/pull repairs what they miss.
	if took := c.waitConverged(antiEntropy, "after the churn"); took > 5*time.Second {
		t.Logf("NOTE: after the churn, broadcasts left some host behind; it took the anti-entropy push/pull (%v) to converge", took.Round(time.Millisecond))
	}
	for _, n := range c.Nodes {
		if udp, err := n.UDPCounters(); err == nil {
			t.Logf("%s UDP counters: %s", n.Name, udp)
		}
	}
	time.Sleep(2 * time.Second)
	c.checkNow("2s after convergence (no late resurrection)")
	c.waitMembers(converge, "after the churn")
	c.checkTraffic(base, false)
	for _, n := range c.Nodes {
		if v, err := n.ClusterView(); err == nil {
			t.Logf("%s stats: %v", n.Name, v.Stats)
		}
	}
}
