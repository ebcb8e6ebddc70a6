package realtime

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Write writes the report as <base>.json, <base>.md and <base>.png in dir.
func (rep *Report) Write(dir, base string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, base+".json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, base+".md"), []byte(rep.Markdown(base+".png")), 0o644); err != nil {
		return err
	}
	return rep.plot(filepath.Join(dir, base+".png"))
}

// Markdown renders the report; png names the plot next to it.
func (rep *Report) Markdown(png string) string {
	p := rep.Params
	var b strings.Builder
	fmt.Fprintf(&b, "# Real-time scale benchmark: %d hosts, %d endpoints\n\n", p.Hosts, p.Endpoints)
	fmt.Fprintf(&b, "Both systems over real UDP/TCP sockets on loopback, one instance per host, each host on its own 127/8 address, "+
		"all in one process (%s, GOMAXPROCS %d, %s, kernel %s; commit %s; %s). Every host publishes %d endpoints in %d waves, "+
		"one wave every %v (%d endpoints per wave in all); give-up time %v after the first publish. "+
		"Interleaved: %d repetition(s) of %s, in this order. Started %s.\n\n",
		rep.Env.Go, rep.Env.GOMAXPROCS, rep.Env.CPU, rep.Env.Kernel, rep.Env.Commit, modules(rep.Env.Modules),
		p.perHost(), p.Waves, p.WaveInterval, p.Endpoints/p.Waves, p.Timeout, rep.Reps, strings.Join(rep.Systems, ", "), rep.Env.Started.Format("2006-01-02 15:04 UTC"))
	b.WriteString("Settings: the plugin with `cluster` defaults (memberlist DefaultLANConfig; records pushed by their owner to the network's members, digest anti-entropy every second); " +
		"NetworkDB with `networkdb.DefaultConfig()` (memberlist DefaultLANConfig, bulk sync every 30 s). Nothing was changed for the 2-core machine; " +
		"\"lowest share of member views alive\" shows whether a host took another for failed. Gossip is unencrypted but in plugin-secret (a 32-byte key: AES-GCM). " +
		"Records received and stale (already held) are the plugin's own counters summed over the hosts, from the first publish to convergence.\n\n")

	b.WriteString("| figure | unit | plugin min / median / max | plugin-secret min / median / max | NetworkDB min / median / max | secret ÷ plugin | NetworkDB ÷ plugin |\n|---|---|---|---|---|---|---|\n")
	for _, f := range rep.Summary {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", f.Name, f.Unit, f.Plugin.format(f.Unit), f.PluginSecret.format(f.Unit),
			f.NetworkDB.format(f.Unit), ratioString(f.SecretRatio), ratioString(f.Ratio))
	}
	b.WriteString("\n\"—\": not reached (the quantile falls among endpoints that never arrived before the give-up time) or no run got that far.\n\n")

	b.WriteString("## Runs\n\n| rep | system | converged | correct | endpoints everywhere | pairs | p50 / p99 / max (s) | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "| %d | %s | %v | %v | %d / %d | %d / %d | %s / %s / %s | %s |\n", r.Rep, r.System, r.Converged, r.Correct,
			r.EndpointsConverged, p.Endpoints, r.PairsSeen, r.PairsWanted, secs(r.Endpoint.P50), secs(r.Endpoint.P99), secs(r.Endpoint.Max),
			strings.Join(r.Errors, "; "))
	}
	for _, r := range rep.Runs {
		if len(r.Warnings) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nWarnings and errors logged by %s (rep %d) after the first publish, by message (hosts, addresses and ids elided):\n\n", r.System, r.Rep)
		keys := make([]string, 0, len(r.Warnings))
		for k := range r.Warnings {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(x, y string) int { return r.Warnings[y] - r.Warnings[x] })
		for _, k := range keys[:min(len(keys), 10)] {
			fmt.Fprintf(&b, "- %d × `%s`\n", r.Warnings[k], strings.ReplaceAll(k, "`", "'"))
		}
	}
	fmt.Fprintf(&b, "\n![share of endpoints on every other host vs time since the first publish](%s)\n", png)
	return b.String()
}

func (s Spread) format(unit string) string {
	if s.N == 0 {
		return "—"
	}
	f := func(v float64) string {
		switch unit {
		case "share", "ratio":
			return fmt.Sprintf("%.3f", v)
		case "B/s", "KiB", "count":
			return fmt.Sprintf("%.0f", v)
		default:
			return fmt.Sprintf("%.2f", v)
		}
	}
	return f(s.Min) + " / " + f(s.Median) + " / " + f(s.Max)
}

func ratioString(r *float64) string {
	if r == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f", *r)
}

func secs(v *float64) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f", *v)
}

func modules(m map[string]string) string {
	var out []string
	for k, v := range m {
		out = append(out, k+" "+v)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// plot draws the share of endpoints converged over time, one line per run.
func (rep *Report) plot(file string) error {
	pl := plot.New()
	pl.Title.Text = fmt.Sprintf("%d hosts, %d endpoints in %d waves every %v", rep.Params.Hosts, rep.Params.Endpoints, rep.Params.Waves, rep.Params.WaveInterval)
	pl.X.Label.Text = "seconds since the first publish"
	pl.Y.Label.Text = "share of endpoints on every other host"
	pl.Y.Min, pl.Y.Max = 0, 1
	pl.Add(plotter.NewGrid())
	colors := map[string]color.Color{"plugin": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, "plugin-secret": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		"networkdb": color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}}
	for _, r := range rep.Runs {
		if len(r.EndpointCurve) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(r.EndpointCurve))
		for i, v := range r.EndpointCurve {
			pts[i] = plotter.XY{X: float64(i) * r.CurveStepSec, Y: v}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = colors[r.System]
		l.Width = vg.Points(1.5)
		if r.Rep > 1 {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		pl.Add(l)
		pl.Legend.Add(fmt.Sprintf("%s, rep %d", r.System, r.Rep), l)
	}
	// Upper left, below the top: the curves are near 0 there.
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.XOffs, pl.Legend.YOffs = vg.Points(12), -vg.Inch
	return pl.Save(8*vg.Inch, 5*vg.Inch, file)
}
