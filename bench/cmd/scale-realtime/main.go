// Command scale-realtime runs the real-time scale benchmark (package
// realtime): the plugin's control plane and Docker's NetworkDB, the same
// scenario over real sockets on loopback, interleaved. Run it alone on the
// machine (make bench-scale-realtime holds /tmp/overlay-timing.lock).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/bench/realtime"
)

func main() {
	d := realtime.DefaultParams()
	hosts := flag.String("hosts", strconv.Itoa(d.Hosts), "host counts to run, comma-separated (each writes its own files)")
	flag.IntVar(&d.Endpoints, "endpoints", d.Endpoints, "endpoints in all, split evenly over the hosts")
	flag.IntVar(&d.Waves, "waves", d.Waves, "waves; in each every host publishes its next endpoints/hosts/waves endpoints")
	flag.DurationVar(&d.WaveInterval, "wave-interval", d.WaveInterval, "time between wave starts")
	flag.DurationVar(&d.Timeout, "timeout", d.Timeout, "give up this long after the first publish (also bounds membership and network set-up)")
	flag.IntVar(&d.Seeds, "seeds", d.Seeds, "hosts every host is told to join")
	reps := flag.Int("reps", 1, "repetitions; each runs every system of -systems in turn")
	systems := flag.String("systems", strings.Join(realtime.Systems, ","), "systems to run, comma-separated, in this order")
	out := flag.String("out", "bench/results/scale-realtime", "directory for h<hosts>.json, .md and .png")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	logger := log.New(os.Stderr, "", log.Ltime)
	failed := false
	for _, h := range strings.Split(*hosts, ",") {
		p := d
		n, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil {
			logger.Fatalf("-hosts: %v", err)
		}
		p.Hosts = n
		t0 := time.Now()
		rep, err := realtime.Run(realtime.Options{Params: p, Reps: *reps, Systems: strings.Split(*systems, ","), Progress: func(s string) { logger.Print(s) }})
		if rep == nil {
			logger.Fatal(err)
		}
		if err != nil {
			logger.Printf("%d hosts: %v", n, err)
		}
		// NetworkDB not converging is a figure; the plugin's failing is a
		// bug, and fails the run.
		for _, r := range rep.Runs {
			if r.System == "plugin" && !r.Correct {
				failed = true
			}
		}
		base := fmt.Sprintf("h%d", n)
		if err := rep.Write(*out, base); err != nil {
			logger.Fatal(err)
		}
		fmt.Println(rep.Markdown(base + ".png"))
		logger.Printf("%d hosts done in %v; wrote %s/%s.{json,md,png}", n, time.Since(t0).Round(time.Second), *out, base)
	}
	if failed {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
