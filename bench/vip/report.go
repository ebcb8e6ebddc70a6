package vip

import (
	"fmt"
	"strings"

	"gonum.org/v1/plot"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// Report is the vip figure.
type Report struct {
	Env report.Env `json:"env"`
	// The settings (Reps, Services, Tasks, Clients, Changes).
	Options
	// Cases summarise the Runs, one per service count.
	Cases []Case `json:"cases"`
	Runs  []Run  `json:"runs"`
	// Correct: every run's connections reached exactly the live tasks.
	Correct bool `json:"correct"`
}

// Case summarises one service count over the repetitions.
type Case struct {
	Services int `json:"services"`
	// JoinMs: each client's Join (its first table); JoinMaxMs: the
	// slowest client's, per repetition.
	JoinMs      report.Stat `json:"joinMs"`
	JoinMaxMs   report.Stat `json:"joinMaxMs"`
	JoinCPUMs   report.Stat `json:"joinCpuMs"`
	JoinObjects report.Stat `json:"joinObjects"`
	// By way of writing a change (Increment, Replace).
	ChangeMs map[string]report.Stat `json:"changeMs"`
	CPUMs    map[string]report.Stat `json:"cpuMs"`
	Objects  map[string]report.Stat `json:"objectsPerClient"`
}

func (r *Report) summarise(o Options) {
	for _, n := range o.Services {
		c := Case{Services: n, ChangeMs: map[string]report.Stat{}, CPUMs: map[string]report.Stat{}, Objects: map[string]report.Stat{}}
		var join, joinMax, joinCPU, joinObj []float64
		ms, cpu, obj := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
		for _, run := range r.Runs {
			if run.Services != n {
				continue
			}
			join = append(join, run.JoinMs...)
			if len(run.JoinMs) > 0 {
				joinMax = append(joinMax, report.NewStat(run.JoinMs).Max)
				joinCPU, joinObj = append(joinCPU, run.JoinCPUMs), append(joinObj, run.JoinObjects)
			}
			for _, ch := range run.Changes {
				ms[ch.Way] = append(ms[ch.Way], ch.Ms)
				cpu[ch.Way] = append(cpu[ch.Way], ch.CPUMs)
				obj[ch.Way] = append(obj[ch.Way], ch.Objects)
			}
		}
		c.JoinMs, c.JoinMaxMs, c.JoinCPUMs, c.JoinObjects = report.NewStat(join), report.NewStat(joinMax), report.NewStat(joinCPU), report.NewStat(joinObj)
		for _, way := range []string{Replace, Increment} {
			c.ChangeMs[way], c.CPUMs[way], c.Objects[way] = report.NewStat(ms[way]), report.NewStat(cpu[way]), report.NewStat(obj[way])
		}
		r.Cases = append(r.Cases, c)
	}
}

// Markdown renders the vip figure.
func (r *Report) Markdown() string {
	b := strings.Builder{}
	b.WriteString("# Service VIPs at scale\n\n" + r.Env.Line(r.Reps) + "\n\n")
	fmt.Fprintf(&b, "The real servicelb on the running kernel: services of %d tasks on one network, %d client namespaces; the tasks are addresses "+
		"of one backend namespace, which answers each connection with the address it reached. "+
		"Join: a client's first table, one batch (the same path before and after). "+
		"A change replaces one task of one service and is written to every client, %d at a time as the driver does (each container's table is its own); before: the full replace "+
		"(a fresh Programmer, which reads, compares and replaces each table, as every change did before), "+
		"after: the increment; interleaved, the same number of each. "+
		"CPU: the process's user+system time over the change (nf_tables work runs in its system calls). "+
		"Correct, checked by connections from inside the clients: after the Joins each client checks its share of the VIPs (together every VIP) "+
		"and after each change every client checks the changed VIP, each reaching exactly the live tasks (at least %d connections per VIP, until every task answered): %v.\n\n",
		r.Tasks, r.Clients, r.Parallel, minDials, r.Correct)
	for _, run := range r.Runs {
		if run.Error != "" {
			fmt.Fprintf(&b, "- rep %d, %d services stopped: %s\n", run.Rep+1, run.Services, run.Error)
		}
	}
	b.WriteString("| services | figure | before: full replace, min / median / max | after: increment, min / median / max | goal |\n|---|---|---|---|---|\n")
	for _, c := range r.Cases {
		fmt.Fprintf(&b, "| %d | Join → every VIP balanced, ms (each client) | %s | (same) | ≤ 200 ms |\n", c.Services, c.JoinMs)
		fmt.Fprintf(&b, "| %d | Join, slowest of the %d clients, ms | %s | (same) | ≤ 200 ms |\n", c.Services, r.Clients, c.JoinMaxMs)
		fmt.Fprintf(&b, "| %d | Join, objects written / CPU ms per client | %s / %s | (same) | |\n", c.Services, c.JoinObjects, c.JoinCPUMs)
		fmt.Fprintf(&b, "| %d | one task change → every client updated, ms | %s | %s | ≤ 1 s |\n", c.Services, c.ChangeMs[Replace], c.ChangeMs[Increment])
		fmt.Fprintf(&b, "| %d | nft objects written per change, per client | %s | %s | independent of services |\n", c.Services, c.Objects[Replace], c.Objects[Increment])
		fmt.Fprintf(&b, "| %d | CPU per change (all clients), ms | %s | %s | |\n", c.Services, c.CPUMs[Replace], c.CPUMs[Increment])
	}
	return b.String()
}

// Plot draws the change time, before and after, per service count.
func (r *Report) Plot() (*plot.Plot, error) {
	var groups []string
	ss := []report.Series{{Name: "before: full replace"}, {Name: "after: increment"}}
	for _, c := range r.Cases {
		groups = append(groups, fmt.Sprintf("%d services", c.Services))
		ss[0].Stats = append(ss[0].Stats, c.ChangeMs[Replace])
		ss[1].Stats = append(ss[1].Stats, c.ChangeMs[Increment])
	}
	return report.BarPlot(fmt.Sprintf("One task change to %d clients' tables (median, min-max)", r.Clients), "ms", groups, ss)
}
