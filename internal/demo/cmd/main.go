// Command demo is `make demo`: the overlay plugin on three simulated hosts
// of this machine (see package demo). Root only.
//
//	demo [--keep]
//
// It exits 0 only if every ping was answered; on SIGINT or SIGTERM it
// cleans up and exits 128 + the signal's number.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/overlay-plugin/overlay-plugin/internal/demo"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"golang.org/x/sys/unix"
)

func main() {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "pause before cleaning up and print commands to look around")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: demo [--keep]   (as root; make demo DEMO_ARGS=--keep)\n\n"+
			"Three hosts (network namespaces) on this machine, each running the real plugin\n"+
			"with gossip, a network, a container per host pinging every other across hosts\n"+
			"over IPv4 and IPv6. Everything is removed on exit. OVERLAY_PLUGIN_BIN names the\n"+
			"plugin binary (else it is built). Exit status 0 only if every ping answered.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unknown argument %q (try --help)\n", fs.Arg(0))
		os.Exit(2)
	}

	// The first signal cancels the demo, which then cleans up; later ones
	// are ignored so that the cleanup finishes.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	got := make(chan syscall.Signal, 1)
	go func() {
		got <- (<-sigs).(syscall.Signal)
		cancel()
		for range sigs {
		}
	}()

	_, err := demo.Run(ctx, demo.Config{Out: os.Stdout, Color: isTerminal(os.Stdout), Keep: *keep, Stdin: os.Stdin})
	testbed.RemoveBuiltPlugin()
	select {
	case sig := <-got:
		os.Exit(128 + int(sig))
	default:
	}
	if err != nil {
		os.Exit(1)
	}
}

// isTerminal reports whether f is a terminal: colours only there.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
