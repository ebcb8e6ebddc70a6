// Command bench runs the figures of make bench: the kernel-path ones
// (package kernelpath), peer programming and Join latency, this plugin
// against Docker's overlay driver and the references, each run a child
// process in namespaces of its own; and the encrypted network against the
// plain one inside the test VM (package espvm, figure "encrypted", which
// boots the VM with scripts/vm/run.sh and runs this binary there). Root;
// run it alone on the machine (make bench holds /tmp/overlay-timing.lock).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/bench/espvm"
	"github.com/overlay-plugin/overlay-plugin/bench/kernelpath"
	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == kernelpath.WorkerArg {
		if err := kernelpath.Worker(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) == 3 && os.Args[1] == espvm.GuestArg {
		if err := espvm.Guest(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "espvm:", err)
			os.Exit(1)
		}
		return
	}
	o := kernelpath.DefaultOptions()
	eo := espvm.DefaultOptions()
	figures := flag.String("figures", "peers,join", "figures to run: peers, join, encrypted (in the VM)")
	flag.IntVar(&o.Reps, "reps", o.Reps, "repetitions, interleaved")
	peers := flag.String("peers", "10000,50000", "peer counts (in all, split over the networks)")
	nets := flag.String("networks", "1,8", "network counts of the peers figure")
	systems := flag.String("systems", strings.Join(o.Systems, ","), "systems of the peers figure; the first is compared with the others")
	flag.IntVar(&o.Batch, "batch", o.Batch, "peers per AddPeers call of the plugin")
	flag.IntVar(&o.JoinNetworks, "join-networks", o.JoinNetworks, "networks of the join figure")
	flag.IntVar(&o.Joins, "joins", o.Joins, "Joins of the join figure's sequential and concurrent rounds")
	flag.DurationVar(&eo.Duration, "vm-duration", eo.Duration, "encrypted figure: duration of each measurement")
	vmStreams := flag.String("vm-streams", "1,4", "encrypted figure: parallel TCP streams of its throughput figures")
	flag.StringVar(&eo.Plugin, "plugin", eo.Plugin, "encrypted figure: the plugin binary (make build)")
	flag.StringVar(&eo.VMScript, "vm-script", eo.VMScript, "encrypted figure: scripts/vm/run.sh")
	out := flag.String("out", "bench/results", "directory for <figure>.{json,md,png}")
	flag.StringVar(&o.StateDir, "state-dir", "build/bench-state", "directory (on disk) for the plugin's state.db in join runs")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime)
	o.Progress = func(s string) { logger.Print(s) }
	var err error
	if o.PeerCounts, err = ints(*peers); err != nil {
		logger.Fatal(err)
	}
	if o.NetworkCounts, err = ints(*nets); err != nil {
		logger.Fatal(err)
	}
	if eo.Streams, err = ints(*vmStreams); err != nil {
		logger.Fatal(err)
	}
	eo.Reps, eo.Progress = o.Reps, o.Progress
	o.Systems = strings.Split(*systems, ",")
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		logger.Fatal(err)
	}
	failed := false
	for _, f := range strings.Split(*figures, ",") {
		t0 := time.Now()
		var v interface {
			Markdown() string
		}
		var plotErr error
		switch f {
		case "peers":
			rep, err := kernelpath.RunPeers(o)
			if err != nil {
				logger.Fatalf("peers: %v", err)
			}
			failed = failed || !rep.Correct
			plt, err := rep.Plot()
			plotErr = errOr(err, func() error { return report.Write(*out, "peers", rep, rep.Markdown(), plt) })
			v = rep
		case "join":
			rep, err := kernelpath.RunJoin(o)
			if err != nil {
				logger.Fatalf("join: %v", err)
			}
			failed = failed || !rep.Correct
			plt, err := rep.Plot()
			plotErr = errOr(err, func() error { return report.Write(*out, "join", rep, rep.Markdown(), plt) })
			v = rep
		case "encrypted":
			rep, err := espvm.Measure(eo)
			if err != nil {
				logger.Fatalf("encrypted: %v", err)
			}
			if err := rep.Err(); err != nil {
				failed = true
				logger.Printf("encrypted: not correct: %v", err)
			}
			plt, err := rep.Plot()
			plotErr = errOr(err, func() error { return report.Write(*out, "encrypted", rep, rep.Markdown(), plt) })
			v = rep
		default:
			logger.Fatalf("unknown figure %q", f)
		}
		if plotErr != nil {
			logger.Fatal(plotErr)
		}
		fmt.Println(v.Markdown())
		logger.Printf("%s done in %v; wrote %s/%s.{json,md,png}", f, time.Since(t0).Round(time.Second), *out, f)
	}
	if failed {
		logger.Fatal("a run was not correct (see the reports)")
	}
}

func errOr(err error, f func() error) error {
	if err != nil {
		return err
	}
	return f()
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
