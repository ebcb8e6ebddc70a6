package check

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteText prints r for an operator: a line per finding, then the state
// of each path probed, then the verdict.
func (r Report) WriteText(w io.Writer) {
	for _, f := range r.Findings {
		subject := ""
		if f.Subject != "" {
			subject = " " + f.Subject
		}
		fmt.Fprintf(w, "PROBLEM %s%s: %s\n", f.Area, subject, f.Problem)
	}
	if len(r.Paths) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tPATH\tSTATE\tRTT\tMTU\tCROSSES\tSENT\tANSWERED")
		for _, p := range r.Paths {
			crosses := "-"
			if p.PathMTU > 0 {
				crosses = fmt.Sprint(p.PathMTU)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\n", p.Peer, p.Path, p.State, p.RTT.Round(10*time.Microsecond), p.MTU, crosses, p.Sent, p.Answered)
		}
		tw.Flush()
	}
	if r.OK {
		fmt.Fprintf(w, "OK: %d data paths probed, nothing wrong\n", len(r.Paths))
	} else {
		fmt.Fprintf(w, "%d problem(s)\n", len(r.Findings))
	}
}
