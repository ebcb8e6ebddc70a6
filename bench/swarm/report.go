package swarm

import (
	"fmt"
	"strings"

	"gonum.org/v1/plot"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// Markdown renders the reach figure.
func (r *ReachReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# docker run → reachable from the other node\n\n%s\n\n", r.Env.Line(r.Reps))
	fmt.Fprintf(&b, "Two dockerds in network namespaces (scripts/e2e/lib.sh), a swarm; per repetition and system a new attachable swarm-scope network "+
		"(plugin: `%s`, overlay: Docker's built-in `overlay`), a prober container on node1, then on node2 the network's first container (cold: "+
		"the driver builds its sandbox there) and a second one (warm). Timed from the `docker run -d` call to the prober's first established "+
		"TCP connection to the container's httpd (a new attempt every %.0f ms), checked by fetching the container's hostname from it. "+
		"Every plugin run correct: %v.\n\n", r.Plugin, r.ProbeEveryMs, r.Correct)
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "- rep %d, %s, %s: %s\n", run.Rep+1, run.System, run.Case, run.Error)
		}
	}
	b.WriteString("\n| case | plugin ms min / median / max | overlay ms min / median / max | overlay ÷ plugin min / median / max |\n|---|---|---|---|\n")
	for _, c := range reachCases {
		fmt.Fprintf(&b, "| %s: reachable | %s | %s | %s |\n", c, msStat(r.Reachable[c][sysPlugin]), msStat(r.Reachable[c][sysOverlay]), r.Ratio[c])
	}
	for _, c := range reachCases {
		fmt.Fprintf(&b, "| %s: docker run -d returned | %s | %s | |\n", c, msStat(r.RunReturned[c][sysPlugin]), msStat(r.RunReturned[c][sysOverlay]))
	}
	for _, c := range reachCases {
		fmt.Fprintf(&b, "| %s: reachable − docker run -d returned | %s | %s | |\n", c, msStat(r.AfterReturn[c][sysPlugin]), msStat(r.AfterReturn[c][sysOverlay]))
	}
	return b.String()
}

// Plot draws the reach figure.
func (r *ReachReport) Plot() (*plot.Plot, error) {
	var ss []report.Series
	for _, sys := range []string{sysPlugin, sysOverlay} {
		s := report.Series{Name: sys}
		for _, c := range reachCases {
			s.Stats = append(s.Stats, r.Reachable[c][sys])
		}
		ss = append(ss, s)
	}
	return report.BarPlot("docker run → reachable from the other node (median, min-max)", "ms", reachCases, ss)
}

// Markdown renders the throughput figure.
func (r *ThroughputReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Cross-host TCP throughput\n\n%s\n\n", r.Env.Line(r.Reps))
	fmt.Fprintf(&b, "Container on node1 → container on node2 on an attachable swarm network (plugin: `%s`; overlay: Docker's built-in `overlay`), "+
		"and node1 → node2 over the underlay (the nodes' own namespaces); %.0f s per run, 128 KiB writes, the systems in turn per repetition and "+
		"stream count. Gbit/s: bytes received over first write → last stream's end at the receiver. MTU of the sending interface: %s. "+
		"Every plugin run correct (each stream received exactly the bytes sent, and at least as many bytes crossed node1's port of the switch): %v.\n\n",
		r.Plugin, r.SecondsEach, mtus(r.MTU, r.Systems), r.Correct)
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "- rep %d, %s, %d stream(s): %s\n", run.Rep+1, run.System, run.Streams, run.Error)
		}
	}
	b.WriteString("\n| streams | system | Gbit/s min / median / max | plugin ÷ system min / median / max |\n|---|---|---|---|\n")
	for _, c := range r.Cases {
		for _, sys := range r.Systems {
			ratio := "—"
			if st, ok := c.Ratio[sys]; ok {
				ratio = st.String()
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", c.Streams, sys, c.Gbps[sys], ratio)
		}
	}
	return b.String()
}

// msStat prints a Stat of milliseconds to the millisecond (Stat.String
// writes 1.3k for 1,349, and its rounding is for positive figures).
func msStat(s report.Stat) string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f / %.0f / %.0f", s.Min, s.Median, s.Max)
}

func mtus(m map[string]int, systems []string) string {
	var s []string
	for _, sys := range systems {
		s = append(s, fmt.Sprintf("%s %d", sys, m[sys]))
	}
	return strings.Join(s, ", ")
}

// Plot draws the throughput figure.
func (r *ThroughputReport) Plot() (*plot.Plot, error) {
	var groups []string
	for _, c := range r.Cases {
		groups = append(groups, fmt.Sprintf("%d stream(s)", c.Streams))
	}
	var ss []report.Series
	for _, sys := range r.Systems {
		s := report.Series{Name: sys}
		for _, c := range r.Cases {
			s.Stats = append(s.Stats, c.Gbps[sys])
		}
		ss = append(ss, s)
	}
	return report.BarPlot("Cross-host TCP throughput (median, min-max)", "Gbit/s", groups, ss)
}
