package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// Config says where the demo writes and whether it pauses.
type Config struct {
	Out io.Writer
	// Color paints the output with ANSI codes: for a terminal only.
	Color bool
	// Keep pauses before cleaning up, until a line (Enter) or EOF on
	// Stdin, or the context's end.
	Keep  bool
	Stdin io.Reader
}

// Result counts the pings; a ping is one container reaching another over
// one address family.
type Result struct {
	Passed, Failed int
	// FailedPings names each failed ping ("c1->c2 203.0.113.12").
	FailedPings []string
}

// run is the state one demo builds up, step by step.
type run struct {
	cfg     Config
	out     *printer
	start   time.Time
	bin     string
	bed     *testbed.Bed
	topo    *testbed.Topology
	plugins []*testbed.Plugin // by host
	netID   string
	ctrs    []*testbed.Container // by host
	res     Result
}

// Run runs the demo and ends with a verdict line. Everything it made is
// removed before it returns, whatever happened (a failed removal is said in
// red and returned too). The error is nil only if every ping was answered;
// a cancelled ctx (Ctrl-C) ends the demo at the next step, with ctx.Err().
func Run(ctx context.Context, cfg Config) (Result, error) {
	r := &run{cfg: cfg, out: &printer{w: cfg.Out, color: cfg.Color}, start: time.Now()}
	err := r.run(ctx)
	switch {
	case ctx.Err() != nil:
		r.out.verdict(red, "interrupted")
	case err != nil:
		r.out.verdict(red, err.Error())
	default:
		r.out.verdict(green, fmt.Sprintf("all %d pings passed", r.res.Passed))
	}
	return r.res, err
}

// run is Run before the verdict.
func (r *run) run(ctx context.Context) (err error) {
	if err := r.preflight(ctx); err != nil {
		return err
	}
	r.bed = testbed.New(nil)
	defer func() { err = errors.Join(err, r.cleanup()) }()
	err = r.steps(ctx)
	if ctx.Err() != nil {
		// A step cut short by Ctrl-C fails with its own error: name the cause.
		err = ctx.Err()
	}
	return err
}

// steps runs the demo proper, stopping at the first error.
func (r *run) steps(ctx context.Context) error {
	for _, step := range []func(context.Context) error{
		r.startCluster,
		r.actAsDockerd,
		r.waitGossip,
		r.showMembers,
		r.showLearned,
		r.pingAll,
	} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(ctx); err != nil {
			return err
		}
	}
	r.summary()
	if r.cfg.Keep {
		if err := r.keep(ctx); err != nil {
			return err
		}
	}
	if r.res.Failed > 0 {
		return fmt.Errorf("%d of %d pings failed", r.res.Failed, r.res.Passed+r.res.Failed)
	}
	return nil
}

// preflight checks and installs what the demo needs and picks the plugin
// binary, before anything is created.
func (r *run) preflight(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("run me as root (network namespaces need it): sudo make demo")
	}
	if err := installMissing(ctx, r.out); err != nil {
		return err
	}
	if err := testbed.Check(); err != nil {
		return fmt.Errorf("this machine cannot run the demo: %w", err)
	}
	// A demo killed outright (SIGKILL) could not clean up.
	if err := testbed.SweepStale(); err != nil {
		r.out.say("%s", r.out.paint(yellow, "removing what killed runs left: "+err.Error()))
	}
	given := os.Getenv("OVERLAY_PLUGIN_BIN") != ""
	if !given {
		r.out.step("Building the plugin (go build ./cmd/overlay-plugin)")
	}
	var err error
	if r.bin, err = testbed.PluginBinary(); err != nil {
		return err
	}
	if given {
		r.out.step("Using the plugin binary %s (OVERLAY_PLUGIN_BIN)", r.bin)
	}
	return nil
}

// summary prints the pings' tally and the time taken.
func (r *run) summary() {
	r.out.step("Summary")
	r.out.say("%d hosts, gossip members and endpoints spread without any manual peer", len(r.topo.Hosts))
	r.out.say("pings: %d passed, %d failed (of %d)", r.res.Passed, r.res.Failed, r.res.Passed+r.res.Failed)
	if r.res.Failed > 0 {
		r.out.say("%s", r.out.paint(red, "failed: "+strings.Join(r.res.FailedPings, ", ")))
	}
	r.out.say("took %.0f s", time.Since(r.start).Seconds())
}
