package kernelpath

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Write puts v as <name>.json, md as <name>.md and the plot as
// <name>.png into dir.
func Write(dir, name string, v any, md string, plt *plot.Plot) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	return plt.Save(18*vg.Centimeter, 11*vg.Centimeter, filepath.Join(dir, name+".png"))
}

// series is one bar per group: the median, with min and max as error bars.
type series struct {
	name  string
	stats []Stat
}

type errBars []Stat

func (e errBars) Len() int                    { return len(e) }
func (e errBars) XY(i int) (float64, float64) { return float64(i), e[i].Median }
func (e errBars) YError(i int) (float64, float64) {
	return e[i].Median - e[i].Min, e[i].Max - e[i].Median
}

func barPlot(title, ylabel string, groups []string, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	w := vg.Points(60 / float64(len(ss)))
	for i, s := range ss {
		vals := make(plotter.Values, len(s.stats))
		for j, st := range s.stats {
			vals[j] = st.Median
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		off := w * vg.Length(float64(i)-float64(len(ss)-1)/2)
		b.Offset = off
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		eb, err := plotter.NewYErrorBars(errBars(s.stats))
		if err != nil {
			return nil, err
		}
		eb.LineStyle.Color = color.Black
		// Error bars sit on the group centre; shift them with the bar.
		p.Add(b, &shifted{eb, off})
		p.Legend.Add(s.name, b)
	}
	p.Legend.Top = true
	p.NominalX(groups...)
	p.Y.Min = 0
	return p, nil
}

// shifted draws a plotter moved right by dx.
type shifted struct {
	*plotter.YErrorBars
	dx vg.Length
}

func (s *shifted) Plot(c draw.Canvas, p *plot.Plot) {
	c.Rectangle.Min.X += s.dx
	c.Rectangle.Max.X += s.dx
	s.YErrorBars.Plot(c, p)
}

// Markdown renders the peers figure.
func (r *PeersReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Peer programming: peers per second\n\n%s\n\n", r.Env.line(r.Reps))
	fmt.Fprintf(&b, "Systems in each repetition's order: %s. Plugin batches: %d peers per AddPeers call. Every run correct (exact entry counts): %v.\n\n",
		strings.Join(r.Systems, ", "), r.Batch, r.Correct)
	b.WriteString("| networks | peers | system | peers/s min / median / max | plugin ÷ system min / median / max |\n|---|---|---|---|---|\n")
	for _, c := range r.Cases {
		for _, sys := range r.Systems {
			ratio := "—"
			if st, ok := c.Ratio[sys]; ok {
				ratio = st.String()
			}
			fmt.Fprintf(&b, "| %d | %d | %s | %s | %s |\n", c.Networks, c.Peers, sys, c.Rate[sys], ratio)
		}
	}
	return b.String()
}

// Plot draws the peers figure: median peers/s per setting and system.
func (r *PeersReport) Plot() (*plot.Plot, error) {
	var groups []string
	var ss []series
	for _, sys := range r.Systems {
		s := series{name: sys}
		for _, c := range r.Cases {
			s.stats = append(s.stats, c.Rate[sys])
		}
		ss = append(ss, s)
	}
	for _, c := range r.Cases {
		groups = append(groups, fmt.Sprintf("%d net, %dk", c.Networks, c.Peers/1000))
	}
	return barPlot("Peers programmed per second (median, min-max)", "peers/s", groups, ss)
}

// Markdown renders the join figure.
func (r *JoinReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Join latency\n\n%s\n\n", r.Env.line(r.Reps))
	fmt.Fprintf(&b, "%d networks; %d Joins into existing sandboxes (endpoint i in network i mod %d), in sequence and then all at once. "+
		"Each timed Join is CreateEndpoint + Join. Every plugin run correct: %v. \"—\": not measured (see the runs' errors).\n\n", r.Networks, r.Joins, r.Networks, r.Correct)
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "- rep %d, %s stopped: %s\n", run.Rep+1, run.System, run.Error)
		}
	}
	b.WriteString("\n")
	b.WriteString("| figure | plugin min / median / max | moby min / median / max | moby ÷ plugin min / median / max |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| first Join (builds the sandbox), p50 ms | %s | %s | %s |\n", r.FirstP50["plugin"], r.FirstP50["moby"], r.FirstRatio)
	fmt.Fprintf(&b, "| Join into an existing sandbox, p50 ms | %s | %s | %s |\n", r.ExistingP50["plugin"], r.ExistingP50["moby"], r.ExistingRatio)
	fmt.Fprintf(&b, "| %d concurrent ÷ the same in sequence | %s | %s | %s (concurrent wall time) |\n", r.Joins, r.ConcOverSeq["plugin"], r.ConcOverSeq["moby"], r.ConcRatio)
	return b.String()
}

// Plot draws the join figure's latencies.
func (r *JoinReport) Plot() (*plot.Plot, error) {
	groups := []string{"first Join p50", "existing sandbox p50"}
	var ss []series
	for _, sys := range []string{"plugin", "moby"} {
		ss = append(ss, series{name: sys, stats: []Stat{r.FirstP50[sys], r.ExistingP50[sys]}})
	}
	return barPlot("Join latency (median of runs, min-max)", "ms", groups, ss)
}

func (e Env) line(reps int) string {
	return fmt.Sprintf("%d repetition(s), interleaved; started %s; %s, kernel %s, %d CPUs, commit %s; load average before %s, after %s, highest 1-min between runs %.2f.",
		reps, e.Started.Format("2006-01-02 15:04 UTC"), e.Go, e.Kernel, e.CPUs, e.Commit, e.LoadBefore, e.LoadAfter, e.MaxLoad1)
}
