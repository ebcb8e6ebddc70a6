package report

import (
	"encoding/json"
	"image/color"
	"os"
	"path/filepath"

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

// Series is one bar per group: the median, with min and max as error bars.
type Series struct {
	Name  string
	Stats []Stat
}

// ErrBars plots each Stat as its median with min and max as error bars.
type ErrBars []Stat

func (e ErrBars) Len() int                    { return len(e) }
func (e ErrBars) XY(i int) (float64, float64) { return float64(i), e[i].Median }
func (e ErrBars) YError(i int) (float64, float64) {
	return e[i].Median - e[i].Min, e[i].Max - e[i].Median
}

// BarPlot draws groups of bars, one bar per series in each group.
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
