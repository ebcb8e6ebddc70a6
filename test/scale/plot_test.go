package scale

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// plotDir draws convergence.png in dir from every results JSON there: the
// share of endpoints converged against the time since the first Join, one
// line per run. There is no font in the standard library, so the legend
// and the axis scale go to convergence.md.
func plotDir(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return err
	}
	type line struct {
		name  string
		curve [][2]float64
	}
	var lines []line
	xMax := 0.0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r results
		if json.Unmarshal(b, &r) != nil || len(r.Convergence.Curve) < 2 {
			continue
		}
		lines = append(lines, line{strings.TrimSuffix(filepath.Base(f), ".json"), r.Convergence.Curve})
		xMax = max(xMax, r.Convergence.Curve[len(r.Convergence.Curve)-1][0])
	}
	if len(lines) == 0 {
		return nil
	}
	step := niceStep(xMax)
	xMax = math.Ceil(xMax/step) * step

	const w, h, m = 900, 500, 20
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	px := func(x, y float64) (int, int) {
		return m + int(x/xMax*(w-2*m)), h - m - int(y*(h-2*m))
	}
	grey := color.RGBA{0xd0, 0xd0, 0xd0, 0xff}
	for x := 0.0; x <= xMax+step/2; x += step {
		drawLine(img, px, x, 0, x, 1, grey, 0)
	}
	for y := 0.0; y <= 1; y += .25 {
		drawLine(img, px, 0, y, xMax, y, grey, 0)
	}
	var legend strings.Builder
	fmt.Fprintf(&legend, "# Convergence over time\n\nconvergence.png: share of endpoints programmed on every host of their network (y, 0 to 100 %%, grid every 25 %%) against the simulated time since the first Join (x, 0 to %g s, grid every %g s).\n\n", xMax, step)
	for i, l := range lines {
		c := palette[i%len(palette)]
		for k := 1; k < len(l.curve); k++ {
			drawLine(img, px, l.curve[k-1][0], l.curve[k-1][1], l.curve[k][0], l.curve[k][1], c.rgba, 1)
		}
		fmt.Fprintf(&legend, "- %s: %s\n", c.name, l.name)
	}
	f, err := os.Create(filepath.Join(dir, "convergence.png"))
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "convergence.md"), []byte(legend.String()), 0o644)
}

var palette = []struct {
	name string
	rgba color.RGBA
}{
	{"blue", color.RGBA{0x1f, 0x77, 0xb4, 0xff}}, {"orange", color.RGBA{0xff, 0x7f, 0x0e, 0xff}},
	{"green", color.RGBA{0x2c, 0xa0, 0x2c, 0xff}}, {"red", color.RGBA{0xd6, 0x27, 0x28, 0xff}},
	{"purple", color.RGBA{0x94, 0x67, 0xbd, 0xff}}, {"brown", color.RGBA{0x8c, 0x56, 0x4b, 0xff}},
	{"pink", color.RGBA{0xe3, 0x77, 0xc2, 0xff}}, {"grey", color.RGBA{0x7f, 0x7f, 0x7f, 0xff}},
}

// niceStep is a 1, 2 or 5 × 10^k grid step giving at most 10 lines.
func niceStep(span float64) float64 {
	if span <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(span/10)))
	for _, s := range []float64{1, 2, 5, 10} {
		if span/(s*p) <= 10 {
			return s * p
		}
	}
	return 10 * p
}

// drawLine draws from (x0,y0) to (x1,y1) in data coordinates, thick pixels
// either side.
func drawLine(img *image.RGBA, px func(x, y float64) (int, int), x0, y0, x1, y1 float64, c color.RGBA, thick int) {
	ax, ay := px(x0, y0)
	bx, by := px(x1, y1)
	n := max(abs(bx-ax), abs(by-ay), 1)
	for i := 0; i <= n; i++ {
		x, y := ax+(bx-ax)*i/n, ay+(by-ay)*i/n
		for dx := -thick; dx <= thick; dx++ {
			for dy := -thick; dy <= thick; dy++ {
				img.SetRGBA(x+dx, y+dy, c)
			}
		}
	}
}

func abs(v int) int { return max(v, -v) }
