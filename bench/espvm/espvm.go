// Package espvm measures the cost of the plugin's encryption: an
// encrypted overlay network (IPsec ESP, AES-GCM) against a plain one,
// between two hosts, interleaved in the same run. The machine's kernel may
// lack ESP, so the measuring runs in the test VM (scripts/vm: Debian's
// stock kernel under qemu, TCG without KVM) as this binary's guest mode
// (Guest), with the real plugin on hosts that are network namespaces
// (internal/testbed, as test/encrypted). The VM is emulated: absolute
// figures say little about real hardware, so only the ratios encrypted ÷
// plain are reported as the result. Nothing about speed is asserted; a
// run fails only if it is not correct.
package espvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// Options configure Measure.
type Options struct {
	Reps int
	// Duration of each throughput and round-trip measurement.
	Duration time.Duration
	// Streams: a throughput figure for each count of parallel TCP streams.
	Streams []int
	// Plugin is the plugin binary the hosts run; VMScript is
	// scripts/vm/run.sh. Both are host paths (the guest sees the host's /).
	Plugin, VMScript string
	// Progress receives the host's progress lines; the guest's console is
	// streamed to Console.
	Progress func(string)
	Console  *os.File
}

// DefaultOptions are make bench's.
func DefaultOptions() Options {
	return Options{Reps: 3, Duration: 5 * time.Second, Streams: []int{1, 4},
		Plugin: "bin/overlay-plugin", VMScript: "scripts/vm/run.sh", Console: os.Stderr}
}

// figure is one measured quantity of a run.
type figure struct {
	ID      string // in Run.Figure
	Streams int    // 0: round trips
}

func figures(streams []int) []figure {
	var out []figure
	for _, n := range streams {
		out = append(out, figure{ID: fmt.Sprintf("tcp%d", n), Streams: n})
	}
	return append(out, figure{ID: "rtt"})
}

// VM describes the guest.
type VM struct {
	Kernel string `json:"kernel"`
	CPUs   int    `json:"vcpus"`
	MemMiB string `json:"memMiB"`
	Accel  string `json:"accel"`
	AEAD   string `json:"aead"`
	// AEADDriver: the guest kernel's implementation of AEAD.
	AEADDriver string `json:"aeadDriver"`
	// MTU of the containers' interfaces, by network.
	MTU map[string]int `json:"mtu"`
	// SetupSec: plugins started to SAs programmed and traffic checked.
	SetupSec float64 `json:"setupSec"`
	// WallSec: the whole VM run, boot to power-off, seen from the host.
	WallSec float64 `json:"wallSec"`
}

// Row is one line of the report: a quantity on both networks and its
// ratio.
type Row struct {
	Name string `json:"name"`
	Unit string `json:"unit"`
	// Better says which way is faster: "higher" or "lower".
	Better    string      `json:"better"`
	Plain     report.Stat `json:"plain"`
	Encrypted report.Stat `json:"encrypted"`
	// Ratio is encrypted ÷ plain, per repetition.
	Ratio report.Stat `json:"ratio"`
}

// Report is the figure.
type Report struct {
	Env         report.Env `json:"env"`
	VM          VM         `json:"vm"`
	Reps        int        `json:"reps"`
	DurationSec float64    `json:"durationSec"`
	Rows        []Row      `json:"rows"`
	Runs        []Run      `json:"runs"`
	// Correct: the VM ran the job to its end and every run was correct.
	Correct bool   `json:"correct"`
	Error   string `json:"error,omitempty"`
}

// Measure boots the VM once, runs the measurements in it (Guest) and builds
// the report. An error means no report could be made; a report that is
// not Correct is returned as well, for the record.
func Measure(o Options) (*Report, error) {
	rep := &Report{Env: report.NewEnv(), Reps: o.Reps, DurationSec: o.Duration.Seconds()}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	plugin, err := filepath.Abs(o.Plugin)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(plugin); err != nil || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("plugin binary %s: not an executable file (make build): %v", plugin, err)
	}
	share, err := os.MkdirTemp("", "obv-espvm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(share)
	job, err := json.Marshal(Job{Reps: o.Reps, DurationSec: o.Duration.Seconds(), Streams: o.Streams, Out: "/vmshare/espvm.json"})
	if err != nil {
		return nil, err
	}
	// Set-up takes 1-3 minutes in the VM, each measurement its duration
	// and a few seconds of ip(8) and connection set-up; generous, since a
	// loaded machine slows the emulation several times over.
	runs := o.Reps * len(figures(o.Streams)) * 2
	timeout := 420 + runs*int(o.Duration.Seconds()+20)
	if s := os.Getenv("OVERLAY_VM_TIMEOUT"); s != "" {
		if timeout, err = strconv.Atoi(s); err != nil {
			return nil, fmt.Errorf("OVERLAY_VM_TIMEOUT=%q: %w", s, err)
		}
	}
	cmd := exec.Command(o.VMScript, self, GuestArg, string(job))
	cmd.Env = append(os.Environ(),
		"OVERLAY_VM_SHARE="+share,
		"OVERLAY_VM_TIMEOUT="+strconv.Itoa(timeout),
		"OVERLAY_PLUGIN_BIN="+plugin,
		"OVERLAY_VM_PASSENV="+strings.TrimSpace(os.Getenv("OVERLAY_VM_PASSENV")+" OVERLAY_PLUGIN_BIN"))
	cmd.Stdout, cmd.Stderr = o.Console, o.Console
	rep.VM = VM{MemMiB: envOr("OVERLAY_VM_MEM", "1024"), Accel: envOr("OVERLAY_VM_ACCEL", "tcg,thread=multi")}
	o.progress(fmt.Sprintf("espvm: booting the VM: %d repetitions of %v, %s per measurement, VM timeout %ds (load %s)",
		o.Reps, figureIDs(o.Streams), o.Duration, timeout, report.LoadAvg()))
	t0 := time.Now()
	// The host's load while the VM runs: it competes with the emulation.
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				rep.Env.Sample()
			}
		}
	}()
	vmErr := cmd.Run()
	close(stop)
	<-sampled
	rep.VM.WallSec = time.Since(t0).Seconds()
	rep.Env.Sample()
	b, err := os.ReadFile(filepath.Join(share, "espvm.json"))
	if err != nil {
		return nil, fmt.Errorf("the VM left no result (%v): %w", vmErr, err)
	}
	var raw Raw
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("the VM's result: %w", err)
	}
	rep.fill(raw, o.Streams)
	if vmErr != nil {
		rep.Correct = false
		rep.Error = strings.TrimSpace(strings.Join([]string{raw.Error, "VM: " + vmErr.Error()}, "; "))
	}
	rep.Env.Done()
	return rep, nil
}

func (o Options) progress(s string) {
	if o.Progress != nil {
		o.Progress(s)
	}
}

func figureIDs(streams []int) []string {
	var out []string
	for _, f := range figures(streams) {
		out = append(out, f.ID)
	}
	return out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// fill summarises the guest's runs: per figure, the statistics of each
// network's values and of the ratio encrypted ÷ plain within each
// repetition (both runs of the pair correct).
func (r *Report) fill(raw Raw, streams []int) {
	r.VM.Kernel, r.VM.CPUs, r.VM.AEAD, r.VM.AEADDriver, r.VM.MTU, r.VM.SetupSec = raw.Kernel, raw.CPUs, raw.AEAD, raw.AEADDriver, raw.MTU, raw.SetupSec
	r.Runs = raw.Runs
	r.Error = raw.Error
	r.Correct = raw.Error == "" && len(raw.Runs) > 0
	for _, run := range raw.Runs {
		r.Correct = r.Correct && run.Correct
	}
	type quantity struct {
		fig, name, unit, better string
		val                     func(Run) float64
	}
	var qs []quantity
	for _, f := range figures(streams) {
		if f.Streams > 0 {
			name := fmt.Sprintf("TCP throughput, %d stream", f.Streams)
			if f.Streams > 1 {
				name += "s"
			}
			qs = append(qs, quantity{f.ID, name, "Mbit/s", "higher", func(r Run) float64 { return r.Mbps }})
			continue
		}
		qs = append(qs,
			quantity{f.ID, fmt.Sprintf("TCP round trip (%d B request and reply), p50", rttSize), "µs", "lower", func(r Run) float64 { return r.P50Us }},
			quantity{f.ID, "TCP round trip, p99", "µs", "lower", func(r Run) float64 { return r.P99Us }})
	}
	for _, q := range qs {
		vals := map[string][]float64{}
		var ratios []float64
		byRep := map[int]map[string]Run{}
		for _, run := range raw.Runs {
			if run.Figure != q.fig || !run.Correct {
				continue
			}
			vals[run.Network] = append(vals[run.Network], q.val(run))
			if byRep[run.Rep] == nil {
				byRep[run.Rep] = map[string]Run{}
			}
			byRep[run.Rep][run.Network] = run
		}
		for rep := range r.Reps {
			p, okp := byRep[rep][plainNet]
			e, oke := byRep[rep][encNet]
			if okp && oke && q.val(p) > 0 {
				ratios = append(ratios, q.val(e)/q.val(p))
			}
		}
		r.Rows = append(r.Rows, Row{Name: q.name, Unit: q.unit, Better: q.better,
			Plain: report.NewStat(vals[plainNet]), Encrypted: report.NewStat(vals[encNet]), Ratio: report.NewStat(ratios)})
	}
}

// Failures lists the runs that were not correct.
func (r *Report) Failures() []string {
	var out []string
	for _, run := range r.Runs {
		if !run.Correct {
			out = append(out, fmt.Sprintf("rep %d %s %s: %s", run.Rep+1, run.Figure, run.Network, run.Error))
		}
	}
	if r.Error != "" {
		out = append(out, r.Error)
	}
	return out
}

// Err is nil if the report is correct, else what was not.
func (r *Report) Err() error {
	if r.Correct {
		return nil
	}
	if f := r.Failures(); len(f) > 0 {
		return errors.New(strings.Join(f, "; "))
	}
	return errors.New("no runs")
}
