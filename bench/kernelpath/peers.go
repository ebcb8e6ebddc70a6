package kernelpath

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"
)

// PeersResult is one run of the peers figure.
type PeersResult struct {
	Seconds     float64 `json:"seconds"`
	PeersPerSec float64 `json:"peersPerSec"`
	// Neigh and FDB are the entries found on each network's VXLAN device
	// afterwards; Correct: exactly one of each per peer everywhere.
	Neigh   []int `json:"neigh"`
	FDB     []int `json:"fdb"`
	Correct bool  `json:"correct"`
}

func newProgrammer(job Job) (programmer, error) {
	switch job.System {
	case "plugin":
		return newPlugin(job.StateDir, job.Batch, true)
	case "plugin-no-reconciler":
		return newPlugin(job.StateDir, job.Batch, false)
	case "moby":
		return newMoby()
	case "raw":
		return &raw{}, nil
	case "batch":
		return &batch{}, nil
	}
	return nil, fmt.Errorf("unknown system %q", job.System)
}

// runPeers programs job.Peers peers split over job.Networks networks,
// every network from its own goroutine at once, and counts the entries.
func runPeers(job Job) (*PeersResult, error) {
	p, err := newProgrammer(job)
	if err != nil {
		return nil, err
	}
	defer p.close()
	if err := p.setup(job.Networks); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	per := job.Peers / job.Networks
	for k := range job.Networks {
		if err := p.prepare(k, peersOf(k, per)); err != nil {
			return nil, fmt.Errorf("prepare: %w", err)
		}
	}
	errs := make([]error, job.Networks)
	var wg sync.WaitGroup
	stopProfile, err := startProfile(job)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	for k := range job.Networks {
		wg.Go(func() { errs[k] = p.program(k) })
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	stopProfile()
	res := &PeersResult{Seconds: elapsed, PeersPerSec: float64(per*job.Networks) / elapsed, Correct: true}
	for k := range job.Networks {
		if errs[k] != nil {
			return nil, fmt.Errorf("network %d: %w", k, errs[k])
		}
		n, f, err := p.count(k)
		if err != nil {
			return nil, fmt.Errorf("count: %w", err)
		}
		res.Neigh, res.FDB = append(res.Neigh, n), append(res.FDB, f)
		res.Correct = res.Correct && n == per && f == per
	}
	return res, nil
}

// ProfileEnv names a directory: the peers runs write a CPU profile of
// their timed part there, <system>-<networks>x<peers>.pprof (the worker
// inherits the environment of build/bench).
const ProfileEnv = "OVERLAY_BENCH_CPUPROFILE"

func startProfile(job Job) (stop func(), err error) {
	dir := os.Getenv(ProfileEnv)
	if dir == "" {
		return func() {}, nil
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%dx%d.pprof", job.System, job.Networks, job.Peers)))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
