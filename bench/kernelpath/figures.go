package kernelpath

import (
	"fmt"
	"os"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// PeersRun is one worker's run in the peers figure.
type PeersRun struct {
	Rep      int    `json:"rep"`
	System   string `json:"system"`
	Networks int    `json:"networks"`
	Peers    int    `json:"peers"`
	PeersResult
}

// PeersCase summarises one (networks, peers) setting.
type PeersCase struct {
	Networks int `json:"networks"`
	Peers    int `json:"peers"`
	// Rate is peers per second by system; Ratio is the first system's
	// rate over each other's, per repetition.
	Rate  map[string]report.Stat `json:"peersPerSec"`
	Ratio map[string]report.Stat `json:"ratio"`
}

// PeersReport is the peers figure.
type PeersReport struct {
	Env     report.Env  `json:"env"`
	Systems []string    `json:"systems"`
	Batch   int         `json:"batch"`
	Reps    int         `json:"reps"`
	Cases   []PeersCase `json:"cases"`
	Runs    []PeersRun  `json:"runs"`
	// Correct: every run found exactly its entries.
	Correct bool `json:"correct"`
}

// RunPeers runs the peers figure: for each setting, Reps repetitions of
// every system in turn (A B C D A B C D ...), each a fresh worker.
func RunPeers(o Options) (*PeersReport, error) {
	rep := &PeersReport{Env: report.NewEnv(), Systems: o.Systems, Batch: o.Batch, Reps: o.Reps, Correct: true}
	for _, nets := range o.NetworkCounts {
		for _, peers := range o.PeerCounts {
			c := PeersCase{Networks: nets, Peers: peers, Rate: map[string]report.Stat{}, Ratio: map[string]report.Stat{}}
			rates := map[string][]float64{}
			ratios := map[string][]float64{}
			for r := range o.Reps {
				got := map[string]float64{}
				for _, sys := range o.Systems {
					job := Job{Figure: "peers", System: sys, Networks: nets, Peers: peers, Batch: o.Batch,
						StateDir: "/run/overlay-bench", ParentNetNS: parentNetNS()}
					var res PeersResult
					if err := spawn(job, &res); err != nil {
						return rep, err
					}
					rep.Env.Sample()
					rep.Runs = append(rep.Runs, PeersRun{Rep: r, System: sys, Networks: nets, Peers: peers, PeersResult: res})
					rep.Correct = rep.Correct && res.Correct
					rates[sys] = append(rates[sys], res.PeersPerSec)
					got[sys] = res.PeersPerSec
					o.Progress(fmt.Sprintf("peers: %d networks, %d peers, rep %d: %s %.0f peers/s, correct %v (load %s)",
						nets, peers, r+1, sys, res.PeersPerSec, res.Correct, report.Loadavg()))
				}
				for _, sys := range o.Systems[1:] {
					ratios[sys] = append(ratios[sys], got[o.Systems[0]]/got[sys])
				}
			}
			for sys, v := range rates {
				c.Rate[sys] = report.Of(v)
			}
			for sys, v := range ratios {
				c.Ratio[sys] = report.Of(v)
			}
			rep.Cases = append(rep.Cases, c)
		}
	}
	rep.Env.Done()
	return rep, nil
}

// JoinRun is one worker's run in the join figure.
type JoinRun struct {
	Rep    int    `json:"rep"`
	System string `json:"system"`
	JoinResult
}

// JoinReport is the join figure.
type JoinReport struct {
	Env      report.Env `json:"env"`
	Networks int        `json:"networks"`
	Joins    int        `json:"joins"`
	Reps     int        `json:"reps"`
	Runs     []JoinRun  `json:"runs"`
	// By system: medians of each run's first and existing-sandbox Join
	// latencies (ms), and concurrent ÷ sequential wall time.
	FirstP50    map[string]report.Stat `json:"firstJoinP50Ms"`
	ExistingP50 map[string]report.Stat `json:"existingJoinP50Ms"`
	ConcOverSeq map[string]report.Stat `json:"concurrentOverSequential"`
	// Ratios, moby ÷ plugin per repetition (higher: the plugin is faster).
	FirstRatio    report.Stat `json:"firstJoinRatio"`
	ExistingRatio report.Stat `json:"existingJoinRatio"`
	ConcRatio     report.Stat `json:"concurrentJoinsRatio"`
	Correct       bool        `json:"correct"`
}

// RunJoin runs the join figure, plugin and moby in turn Reps times.
func RunJoin(o Options) (*JoinReport, error) {
	rep := &JoinReport{Env: report.NewEnv(), Networks: o.JoinNetworks, Joins: o.Joins, Reps: o.Reps, Correct: true,
		FirstP50: map[string]report.Stat{}, ExistingP50: map[string]report.Stat{}, ConcOverSeq: map[string]report.Stat{}}
	first, existing, conc := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	var fr, er, cr []float64
	for r := range o.Reps {
		got := map[string]JoinResult{}
		for _, sys := range []string{"plugin", "moby"} {
			dir := stateDir(o, "join")
			job := Job{Figure: "join", System: sys, Networks: o.JoinNetworks, Joins: o.Joins, Batch: o.Batch,
				StateDir: dir, ParentNetNS: parentNetNS()}
			var res JoinResult
			err := spawn(job, &res)
			os.RemoveAll(dir)
			if err != nil {
				return rep, err
			}
			rep.Env.Sample()
			rep.Runs = append(rep.Runs, JoinRun{Rep: r, System: sys, JoinResult: res})
			// Only the plugin's failures fail the figure; moby's are
			// recorded in its runs.
			rep.Correct = rep.Correct && (res.Correct || sys != "plugin")
			got[sys] = res
			addPos(first, sys, report.Of(res.FirstMs).Median)
			addPos(existing, sys, report.Of(res.ExistingMs).Median)
			if res.ConcurrentSec > 0 && res.Error == "" {
				addPos(conc, sys, res.ConcurrentSec/res.SequentialSec)
			}
			o.Progress(fmt.Sprintf("join: rep %d: %s first p50 %.1f ms, existing p50 %.1f ms, %d joins sequential %.3f s, concurrent %.3f s, correct %v %s(load %s)",
				r+1, sys, report.Of(res.FirstMs).Median, report.Of(res.ExistingMs).Median, o.Joins, res.SequentialSec, res.ConcurrentSec, res.Correct, res.Error, report.Loadavg()))
		}
		p, m := got["plugin"], got["moby"]
		fr = appendRatio(fr, report.Of(m.FirstMs).Median, report.Of(p.FirstMs).Median)
		er = appendRatio(er, report.Of(m.ExistingMs).Median, report.Of(p.ExistingMs).Median)
		if m.Error == "" && p.Error == "" {
			cr = appendRatio(cr, m.ConcurrentSec, p.ConcurrentSec)
		}
	}
	for sys := range first {
		rep.FirstP50[sys], rep.ExistingP50[sys], rep.ConcOverSeq[sys] = report.Of(first[sys]), report.Of(existing[sys]), report.Of(conc[sys])
	}
	rep.FirstRatio, rep.ExistingRatio, rep.ConcRatio = report.Of(fr), report.Of(er), report.Of(cr)
	rep.Env.Done()
	return rep, nil
}

func addPos(m map[string][]float64, k string, v float64) {
	if v > 0 {
		m[k] = append(m[k], v)
	}
}

// appendRatio appends a/b when both were measured.
func appendRatio(r []float64, a, b float64) []float64 {
	if a > 0 && b > 0 {
		r = append(r, a/b)
	}
	return r
}
