package kernelpath

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// joiner is a driver the join figure drives.
type joiner interface {
	createNetwork(k int) error
	join(k, j int) error
	leave(k, j int) error
	close()
}

// JoinResult is one run of the join figure.
type JoinResult struct {
	// FirstMs: each network's first Join, which builds its sandbox.
	FirstMs []float64 `json:"firstMs"`
	// ExistingMs: the sequential Joins into existing sandboxes.
	ExistingMs []float64 `json:"existingMs"`
	// SequentialSec and ConcurrentSec: the same Joins (Joins of them,
	// over the networks) one after the other, and all at once.
	SequentialSec float64 `json:"sequentialSec"`
	ConcurrentSec float64 `json:"concurrentSec"`
	// Correct: every Join succeeded and left exactly one container end
	// per joined endpoint in the worker's namespace.
	Correct bool `json:"correct"`
	// Error: the first failed call, which ended the run there.
	Error string `json:"error,omitempty"`
}

func newJoiner(job Job) (joiner, error) {
	switch job.System {
	case "plugin":
		return newPlugin(job.StateDir, job.Batch, true)
	case "moby":
		return newMoby()
	}
	return nil, fmt.Errorf("unknown system %q", job.System)
}

// runJoin: every network's first Join (timed one by one), then
// job.Joins more Joins spread over the networks, in sequence (each timed),
// left again, then the same Joins all at once. A failed call ends the run
// with what it measured so far and the error.
func runJoin(job Job) (*JoinResult, error) {
	res := &JoinResult{}
	if err := joinRounds(job, res); err != nil {
		res.Error = err.Error()
	}
	return res, nil
}

func joinRounds(job Job, res *JoinResult) error {
	if err := os.MkdirAll(job.StateDir, 0o700); err != nil {
		return err
	}
	j, err := newJoiner(job)
	if err != nil {
		return err
	}
	defer j.close()
	for k := range job.Networks {
		if err := j.createNetwork(k); err != nil {
			return err
		}
		t := time.Now()
		if err := j.join(k, 0); err != nil {
			return fmt.Errorf("first join: %w", err)
		}
		res.FirstMs = append(res.FirstMs, ms(time.Since(t)))
	}
	// Endpoint i goes to network i%Networks.
	t := time.Now()
	for i := range job.Joins {
		s := time.Now()
		if err := j.join(i%job.Networks, 1+i/job.Networks); err != nil {
			return fmt.Errorf("join: %w", err)
		}
		res.ExistingMs = append(res.ExistingMs, ms(time.Since(s)))
	}
	res.SequentialSec = time.Since(t).Seconds()
	for i := range job.Joins {
		if err := j.leave(i%job.Networks, 1+i/job.Networks); err != nil {
			return fmt.Errorf("leave: %w", err)
		}
	}
	errs := make([]error, job.Joins)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range job.Joins {
		wg.Go(func() {
			<-start
			errs[i] = j.join(i%job.Networks, 1+i/job.Networks)
		})
	}
	t = time.Now()
	close(start)
	wg.Wait()
	res.ConcurrentSec = time.Since(t).Seconds()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("concurrent join: %w", err)
		}
	}
	ends, err := vethEnds()
	if err != nil {
		return err
	}
	res.Correct = ends == job.Networks+job.Joins
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// vethEnds counts the veth devices left in the worker's namespace: the
// container ends Docker would move into containers.
func vethEnds() (int, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range links {
		if l.Type() == "veth" {
			n++
		}
	}
	return n, nil
}
