// Package testbed builds throwaway multi-host networks on one Linux machine
// for end-to-end tests of the overlay plugin: network namespaces standing in
// for hosts and containers, a "switch" namespace with a Linux bridge joining
// the hosts' underlay links, a plugin process per host, a Docker-like client
// of the plugin's socket and helpers to send ICMP and TCP between containers.
//
// Everything a Bed creates (namespaces, directories, processes) is recorded
// and removed by Bed.Cleanup in reverse order of creation; with a testing.TB
// the cleanup is registered with TB.Cleanup. Namespace names carry a prefix
// unique to this process (Prefix), so Sweep can remove whatever a crashed
// run left, and SweepStale what dead runs left.
//
// Nothing here touches the root network namespace: every address, route and
// link is created inside a namespace the Bed made. Processes are signalled
// by PID only. Every wait is bounded.
//
// Typical use:
//
//	bed := testbed.New(t)                          // cleanup via t.Cleanup
//	topo, err := bed.NewTopology(testbed.IPv4, 2)   // switch + h1, h2
//	p, err := topo.Hosts[0].StartPlugin(testbed.PluginConfig{})
//	p.API.CreateNetwork(...); p.API.Join(...)      // Docker's plugin protocol
//	p.Admin.AddPeer(...)                           // adminapi.Client
//	ctr, err := topo.Hosts[0].NewContainer("c1")   // ctr.SandboxKey() for Join
//	ctr.Attach(joinResp, mac, addrs...)            // what dockerd does next
//	ctr.PingUntil(dst, 10*time.Second); ctr.TCPExchange(echo.Addr, 1<<20, timeout)
//
// The multi-host suites (test/multihost, test/gossip, test/encrypted) use
// Cluster instead, which does all of the above for N hosts the way dockerd
// and swarm would, and holds the checks they share:
//
//	c, err := bed.NewCluster(testbed.ClusterConfig{Gossip: true, Secret: true})
//	nw, err := c.CreateNetwork(testbed.Overlay)    // allocated on h1, created everywhere
//	ep, err := c.RunContainer(c.Nodes[0], nw, "c1", nw.Addrs(1)...)
//	_, err = c.WaitConverged(nw, nil, timeout, what) // peers and kernel entries everywhere
//	err = c.WaitMembers(nil, timeout, what)          // gossip membership everywhere
//	err = testbed.CheckTraffic(ctrs, testbed.Traffic{...}) // all pairs, ICMP and TCP
//
// Probes (ICMP echo, TCP) run inside this process on OS threads switched
// into the namespace, so no ping, netcat or helper binary is needed.
//
// Requirements: root, iproute2's ip (and bridge), util-linux's nsenter for
// Plugin.SandboxExec, and a kernel with network namespaces, veth, bridge
// and vxlan (see Check).
package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CommandTimeout bounds every external command the package runs.
const CommandTimeout = 30 * time.Second

// runPrefix starts the name of every namespace this process creates.
var runPrefix = fmt.Sprintf("ovtb%d-", os.Getpid())

// bedSeq numbers the Beds of this process, so two Beds never share a name.
var bedSeq atomic.Int64

// Bed owns everything one test (or one demo) creates.
type Bed struct {
	tb     testing.TB // nil outside tests
	prefix string     // runPrefix plus this Bed's sequence number
	dir    string     // scratch directory, removed by Cleanup

	mu       sync.Mutex
	cleanups []cleanup
	done     bool
}

type cleanup struct {
	what string
	fn   func() error
}

// New returns an empty Bed. With a non-nil tb its Cleanup is registered with
// tb.Cleanup and cleanup errors fail the test; New fails the test (Fatal) if
// the scratch directory cannot be made. Without tb, the caller must call
// Cleanup (and New panics on error).
func New(tb testing.TB) *Bed {
	if tb != nil {
		tb.Helper()
	}
	b := &Bed{tb: tb, prefix: fmt.Sprintf("%s%d", runPrefix, bedSeq.Add(1))}
	// A short path: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "ovtb")
	if err != nil {
		if tb != nil {
			tb.Fatalf("testbed: %v", err)
		}
		panic(err)
	}
	b.dir = dir
	b.onCleanup("remove "+dir, func() error { return os.RemoveAll(dir) })
	if tb != nil {
		tb.Cleanup(func() {
			if err := b.Cleanup(); err != nil {
				tb.Errorf("testbed cleanup: %v", err)
			}
		})
	}
	return b
}

// Dir is the Bed's scratch directory.
func (b *Bed) Dir() string { return b.dir }

// Logf logs through the test, or to stderr outside a test.
func (b *Bed) Logf(format string, args ...any) {
	if b.tb != nil {
		b.tb.Helper()
		b.tb.Logf(format, args...)
		return
	}
	fmt.Fprintf(os.Stderr, "testbed: "+format+"\n", args...)
}

// failed reports whether the test failed (false outside a test).
func (b *Bed) failed() bool { return b.tb != nil && b.tb.Failed() }

// onCleanup records fn to run at Cleanup, after everything recorded later.
func (b *Bed) onCleanup(what string, fn func() error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, cleanup{what, fn})
}

// Cleanup undoes everything the Bed created, newest first. Every step runs
// even if an earlier one failed; the errors are joined. Calling it again
// does nothing.
func (b *Bed) Cleanup() error {
	b.mu.Lock()
	list := b.cleanups
	b.cleanups = nil
	b.done = true
	b.mu.Unlock()
	var errs []error
	for i := len(list) - 1; i >= 0; i-- {
		if err := list[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", list[i].what, err))
		}
	}
	return errors.Join(errs...)
}

// closed reports whether Cleanup has run; creating things after it would
// leak them.
func (b *Bed) closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

// CommandError is a failed external command with its output.
type CommandError struct {
	Args   []string
	Output string
	Err    error
}

func (e *CommandError) Error() string {
	out := strings.TrimSpace(e.Output)
	if out == "" {
		out = "(no output)"
	}
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Args, " "), e.Err, out)
}

func (e *CommandError) Unwrap() error { return e.Err }

// Run runs a command with a CommandTimeout bound and returns its combined
// output; on failure the error is a *CommandError holding the command line
// and output.
func Run(args ...string) (string, error) {
	return RunContext(context.Background(), args...)
}

// RunContext is Run with a caller's context (still bounded by CommandTimeout).
func RunContext(ctx context.Context, args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("testbed: empty command")
	}
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %v)", err, CommandTimeout)
		}
		return out.String(), &CommandError{Args: args, Output: out.String(), Err: err}
	}
	return out.String(), nil
}
