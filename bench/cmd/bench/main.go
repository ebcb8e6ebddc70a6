// Command bench runs the figures of make bench. The kernel path (package
// kernelpath): peer programming and Join latency, this plugin against
// Docker's overlay driver and the references, each run a child process in
// namespaces of its own. Service VIPs at scale (package vip): Join and
// task-change latency, incremental against full replace. The swarm (package swarm): docker run → reachable
// and cross-host TCP throughput on a running two-node swarm given by the
// -swarm-* flags (scripts/bench-swarm.sh builds the swarm and passes them).
// The encrypted network against the plain one inside the test VM (package
// espvm, figure "encrypted", which boots the VM with scripts/vm/run.sh and
// runs this binary there). Root; run it alone on the machine (make bench
// holds /tmp/overlay-timing.lock).
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
	"github.com/overlay-plugin/overlay-plugin/bench/swarm"
	"github.com/overlay-plugin/overlay-plugin/bench/vip"
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
	figures := flag.String("figures", "peers,join", "figures to run: peers, join; vip; reach, throughput (need the -swarm-* flags); encrypted (in the VM)")
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
	vo := vip.DefaultOptions()
	vipServices := flag.String("vip-services", "100,1000", "vip figure: service counts, a case each")
	flag.IntVar(&vo.Tasks, "vip-tasks", vo.Tasks, "vip figure: tasks per service")
	flag.IntVar(&vo.Clients, "vip-clients", vo.Clients, "vip figure: client containers (namespaces)")
	flag.IntVar(&vo.Changes, "vip-changes", vo.Changes, "vip figure: task changes of each way per repetition and case")
	flag.IntVar(&vo.Parallel, "vip-parallel", vo.Parallel, "vip figure: clients a change programs at once (the driver's lbParallel)")
	so := swarm.DefaultOptions()
	swarmCLI := flag.String("swarm-docker", "docker", "docker CLI for the swarm figures")
	swarmHosts := flag.String("swarm-hosts", "", "the swarm's docker daemons, manager first: unix:///run/obs-n1.sock,unix:///run/obs-n2.sock")
	swarmNetNS := flag.String("swarm-netns", "", "the nodes' network namespaces, in the same order: /run/netns/obs-n1,/run/netns/obs-n2")
	swarmAddrs := flag.String("swarm-addrs", "", "the nodes' underlay addresses, in the same order")
	flag.StringVar(&so.Plugin, "swarm-plugin", so.Plugin, "the plugin's driver name on the swarm")
	flag.StringVar(&so.Image, "swarm-image", so.Image, "busybox image present on every node")
	flag.DurationVar(&so.Duration, "swarm-duration", so.Duration, "how long each throughput run sends")
	swarmWire := flag.String("swarm-wire", "", "NETNS:IFACE where node1's underlay traffic is counted (the switch's port of node1); empty: not checked")
	swarmStreams := flag.String("swarm-streams", "1,4", "parallel TCP streams of the throughput figure")
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
	vo.Reps, vo.Progress = o.Reps, o.Progress
	if vo.Services, err = ints(*vipServices); err != nil {
		logger.Fatal(err)
	}
	o.Systems = strings.Split(*systems, ",")
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		logger.Fatal(err)
	}
	so.Reps, so.Progress = o.Reps, o.Progress
	if so.Streams, err = ints(*swarmStreams); err != nil {
		logger.Fatal(err)
	}
	if *swarmWire != "" {
		var ok bool
		if so.WireNS, so.WireIf, ok = strings.Cut(*swarmWire, ":"); !ok {
			logger.Fatalf("-swarm-wire %q: want NETNS:IFACE", *swarmWire)
		}
	}
	swarmNodes := func() []swarm.Node {
		hosts, nss, addrs := strings.Split(*swarmHosts, ","), strings.Split(*swarmNetNS, ","), strings.Split(*swarmAddrs, ",")
		if *swarmHosts == "" || len(hosts) < 2 || len(nss) != len(hosts) || len(addrs) != len(hosts) {
			logger.Fatal("the swarm figures need -swarm-hosts, -swarm-netns and -swarm-addrs, two nodes or more each (scripts/bench-swarm.sh passes them)")
		}
		var ns []swarm.Node
		for i := range hosts {
			ns = append(ns, swarm.Node{Name: fmt.Sprintf("node%d", i+1), CLI: []string{*swarmCLI, "-H", hosts[i]}, NetNS: nss[i], Addr: addrs[i]})
		}
		return ns
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
		case "vip":
			rep := vip.RunVIP(vo)
			failed = failed || !rep.Correct
			plt, err := rep.Plot()
			plotErr = errOr(err, func() error { return report.Write(*out, "vip", rep, rep.Markdown(), plt) })
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
		case "reach":
			so.Nodes = swarmNodes()
			rep, err := swarm.RunReach(so)
			if err != nil {
				logger.Printf("reach: %v", err)
			}
			failed = failed || err != nil || !rep.Correct
			plt, perr := rep.Plot()
			plotErr = errOr(perr, func() error { return report.Write(*out, "reach", rep, rep.Markdown(), plt) })
			v = rep
		case "throughput":
			so.Nodes = swarmNodes()
			rep, err := swarm.RunThroughput(so)
			if err != nil {
				logger.Printf("throughput: %v", err)
			}
			failed = failed || err != nil || !rep.Correct
			plt, perr := rep.Plot()
			plotErr = errOr(perr, func() error { return report.Write(*out, "throughput", rep, rep.Markdown(), plt) })
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
