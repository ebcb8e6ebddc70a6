package espvm

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// Markdown renders the figure.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Encrypted vs plain overlay, inside the VM (ratios only)\n\n%s\n\n", r.Env.Line(r.Reps))
	fmt.Fprintf(&b, "VM: Debian's kernel %s under qemu (%s, no KVM), %d vCPUs, %s MiB; %.0f s from boot to power-off, %.0f s of it set-up. "+
		"The VM is emulated: the absolute figures are of the emulation, only the ratios encrypted ÷ plain are the result.\n\n",
		r.VM.Kernel, r.VM.Accel, r.VM.CPUs, r.VM.MemMiB, r.VM.WallSec, r.VM.SetupSec)
	fmt.Fprintf(&b, "Two hosts (network namespaces) run the plugin with gossip and one cluster secret; a container on each host on an encrypted network "+
		"(ESP %s, the kernel's %s, container MTU %d) and on a plain one (MTU %d); from h1's container to h2's. Each repetition measures every figure on the plain "+
		"network and then on the encrypted one, %.0f s each. Correct: every byte sent was received, every request answered, the encrypted "+
		"runs' traffic went through the plugin's SAs (ip -s xfrm state) and the plain runs' did not. Every run correct: %v.\n\n",
		r.VM.AEAD, r.VM.AEADDriver, r.VM.MTU[encNet], r.VM.MTU[plainNet], r.DurationSec, r.Correct)
	for _, f := range r.Failures() {
		fmt.Fprintf(&b, "- not correct: %s\n", f)
	}
	b.WriteString("\n| figure | plain min / median / max | encrypted min / median / max | encrypted ÷ plain min / median / max |\n|---|---|---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s, %s (%s is faster) | %s | %s | %s |\n", row.Name, row.Unit, row.Better, row.Plain, row.Encrypted, row.Ratio)
	}
	return b.String()
}

// Plot draws the ratios on a log scale (a cost of 2× and a gain of 2×
// lie alike far from 1), median with min-max bars, 1 (no cost) dashed.
func (r *Report) Plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Encrypted ÷ plain in the VM (median of repetitions, min-max)"
	p.Y.Label.Text = "encrypted ÷ plain (log scale)"
	p.X.Label.Text = "throughput below 1, round trips above 1: encrypted is slower"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	var groups []string
	var stats report.ErrBars
	lo, hi := 0.5, 2.0
	for _, row := range r.Rows {
		groups = append(groups, shortName(row))
		if row.Ratio.N == 0 {
			row.Ratio = report.Stat{Min: 1, Median: 1, Max: 1} // not measured: drawn at 1
		}
		stats = append(stats, row.Ratio)
		lo, hi = min(lo, row.Ratio.Min), max(hi, row.Ratio.Max)
	}
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Color = color.Gray{Y: 96}
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(one)
	pts, err := plotter.NewScatter(stats)
	if err != nil {
		return nil, err
	}
	pts.GlyphStyle.Shape = draw.CircleGlyph{}
	pts.GlyphStyle.Radius = vg.Points(4)
	pts.GlyphStyle.Color = plotutil.Color(0)
	eb, err := plotter.NewYErrorBars(stats)
	if err != nil {
		return nil, err
	}
	eb.LineStyle.Color = color.Black
	p.Add(eb, pts)
	p.NominalX(groups...)
	p.X.Min, p.X.Max = -0.5, float64(len(groups))-0.5
	p.Y.Min, p.Y.Max = lo/1.5, hi*1.5
	return p, nil
}

// shortName is a row's label on the plot's x axis.
func shortName(row Row) string {
	if n, ok := strings.CutPrefix(row.Name, "TCP throughput, "); ok {
		return "TCP, " + n
	}
	_, q, _ := strings.Cut(row.Name, ", ")
	return "round trip " + q
}
