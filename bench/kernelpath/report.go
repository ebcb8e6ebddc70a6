package kernelpath

import (
	"fmt"
	"strings"

	"gonum.org/v1/plot"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// Markdown renders the peers figure.
func (r *PeersReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Peer programming: peers per second\n\n%s\n\n", r.Env.Line(r.Reps))
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
	var ss []report.Series
	for _, sys := range r.Systems {
		s := report.Series{Name: sys}
		for _, c := range r.Cases {
			s.Stats = append(s.Stats, c.Rate[sys])
		}
		ss = append(ss, s)
	}
	for _, c := range r.Cases {
		groups = append(groups, fmt.Sprintf("%d net, %dk", c.Networks, c.Peers/1000))
	}
	return report.BarPlot("Peers programmed per second (median, min-max)", "peers/s", groups, ss)
}

// Markdown renders the join figure.
func (r *JoinReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Join latency\n\n%s\n\n", r.Env.Line(r.Reps))
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
	var ss []report.Series
	for _, sys := range []string{"plugin", "moby"} {
		ss = append(ss, report.Series{Name: sys, Stats: []Stat{r.FirstP50[sys], r.ExistingP50[sys]}})
	}
	return report.BarPlot("Join latency (median of runs, min-max)", "ms", groups, ss)
}
