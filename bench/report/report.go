// Package report holds what the benchmarks of make bench share in their
// results: the machine's description (Env, with its load average sampled
// between runs), min / median / max of a sample (Stat), the bar plot with
// min-max error bars, and writing <name>.{json,md,png}.
package report

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Env describes the machine a report comes from.
type Env struct {
	Started    time.Time `json:"started"`
	Go         string    `json:"go"`
	Kernel     string    `json:"kernel"`
	CPUs       int       `json:"cpus"`
	Commit     string    `json:"commit"`
	LoadBefore string    `json:"loadavgBefore"`
	LoadAfter  string    `json:"loadavgAfter"`
	// MaxLoad1 is the highest 1-minute load average seen between runs.
	MaxLoad1 float64 `json:"maxLoad1"`
}

// Loadavg is the machine's 1-, 5- and 15-minute load averages.
func Loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func load1() float64 {
	var v float64
	fmt.Sscan(Loadavg(), &v)
	return v
}

// NewEnv describes this machine now.
func NewEnv() Env {
	k, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	c, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return Env{Started: time.Now().UTC(), Go: runtime.Version(), Kernel: strings.TrimSpace(string(k)),
		CPUs: runtime.NumCPU(), Commit: strings.TrimSpace(string(c)), LoadBefore: Loadavg(), MaxLoad1: load1()}
}

// Sample records the load average between runs.
func (e *Env) Sample() { e.MaxLoad1 = max(e.MaxLoad1, load1()) }

// Done records the load average at the end.
func (e *Env) Done() { e.LoadAfter = Loadavg(); e.Sample() }

// Line is the report's first paragraph: repetitions, when, where, load.
func (e Env) Line(reps int) string {
	return fmt.Sprintf("%d repetition(s), interleaved; started %s; %s, kernel %s, %d CPUs, commit %s; load average before %s, after %s, highest 1-min between runs %.2f.",
		reps, e.Started.Format("2006-01-02 15:04 UTC"), e.Go, e.Kernel, e.CPUs, e.Commit, e.LoadBefore, e.LoadAfter, e.MaxLoad1)
}

// Stat is min, median and max of a sample.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Of is the Stat of v (zero for an empty sample).
func Of(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Min: s[0], Median: m, Max: s[len(s)-1], N: len(s)}
}

func (s Stat) String() string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s / %s", Num(s.Min), Num(s.Median), Num(s.Max))
}

// Num prints v with three significant digits or so.
func Num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

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

// Series is one bar per group: the median, with min and max as error bars.
type Series struct {
	Name  string
	Stats []Stat
}

// ErrBars draws each Stat as its median with min and max as error bars
// (plotter.XYer and YErrorer; x is the index).
type ErrBars []Stat

func (e ErrBars) Len() int                    { return len(e) }
func (e ErrBars) XY(i int) (float64, float64) { return float64(i), e[i].Median }
func (e ErrBars) YError(i int) (float64, float64) {
	return e[i].Median - e[i].Min, e[i].Max - e[i].Median
}

// BarPlot draws the series side by side in each group.
func BarPlot(title, ylabel string, groups []string, ss []Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	w := vg.Points(60 / float64(len(ss)))
	for i, s := range ss {
		vals := make(plotter.Values, len(s.Stats))
		for j, st := range s.Stats {
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
		eb, err := plotter.NewYErrorBars(ErrBars(s.Stats))
		if err != nil {
			return nil, err
		}
		eb.LineStyle.Color = color.Black
		// Error bars sit on the group centre; shift them with the bar.
		p.Add(b, &shifted{eb, off})
		p.Legend.Add(s.Name, b)
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
