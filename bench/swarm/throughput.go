package swarm

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/bench/report"
)

// tputPort is the throughput figure's; readyPort the reachability check's
// before it.
const (
	tputPort  = 5201
	readyPort = 5202
)

// ThroughputRun is one run: streams TCP streams for the run's duration.
type ThroughputRun struct {
	Rep     int           `json:"rep"`
	System  string        `json:"system"`
	Streams int           `json:"streams"`
	Gbps    float64       `json:"gbps"`
	Seconds float64       `json:"seconds"`
	Bytes   []StreamBytes `json:"bytes"`
	// WireBytes: what node1 put on the underlay during the run (its
	// switch port's received bytes, headers and all; 0: not counted).
	WireBytes uint64 `json:"wireBytes"`
	// Correct: every stream delivered exactly the bytes sent, and at
	// least as many bytes crossed the wire.
	Correct bool   `json:"correct"`
	Error   string `json:"error,omitempty"`
	Load    string `json:"loadavg"`
}

// ThroughputCase is one stream count's summary.
type ThroughputCase struct {
	Streams int                    `json:"streams"`
	Gbps    map[string]report.Stat `json:"gbps"`
	// Ratio: the plugin's Gbit/s over each other system's, per
	// repetition.
	Ratio map[string]report.Stat `json:"ratio"`
}

// ThroughputReport is the cross-host TCP throughput figure.
type ThroughputReport struct {
	Env         report.Env `json:"env"`
	Reps        int        `json:"reps"`
	Plugin      string     `json:"plugin"`
	Systems     []string   `json:"systems"`
	SecondsEach float64    `json:"secondsPerRun"`
	// MTU of the sending interface by system (the container's eth0, the
	// node's eth0 for the underlay).
	MTU     map[string]int   `json:"mtu"`
	Cases   []ThroughputCase `json:"cases"`
	Runs    []ThroughputRun  `json:"runs"`
	Correct bool             `json:"correct"`
}

// tputEnd is one system's sender and receiver.
type tputEnd struct {
	sendNS, recvNS string
	dst            netip.AddrPort
}

// RunThroughput runs the figure: a container on Nodes[0] sends to one on
// Nodes[1], on a plugin network and on a Docker overlay network, and
// Nodes[0]'s namespace sends to Nodes[1]'s over the underlay; per
// repetition and stream count the three in turn.
func RunThroughput(o Options) (rep *ThroughputReport, err error) {
	systems := []string{sysPlugin, sysOverlay, sysUnderlay}
	rep = &ThroughputReport{Env: report.NewEnv(), Reps: o.Reps, Plugin: o.Plugin, Systems: systems,
		SecondsEach: o.Duration.Seconds(), MTU: map[string]int{}, Correct: true}
	ends := map[string]tputEnd{sysUnderlay: {o.Nodes[0].NetNS, o.Nodes[1].NetNS,
		netip.AddrPortFrom(netip.MustParseAddr(o.Nodes[1].Addr), tputPort)}}
	rep.MTU[sysUnderlay] = mtuIn(o.Nodes[0].NetNS, "eth0")
	defer func() {
		for _, sys := range systems[:2] {
			rm(o.Nodes[0], "obs-send-"+sys)
			rm(o.Nodes[1], "obs-recv-"+sys)
			if e := o.removeNetwork("obs-tput-" + sys); e != nil && err == nil {
				err = e
			}
		}
	}()
	for i, sys := range systems[:2] {
		e, err := o.tputContainers(sys, fmt.Sprintf("198.19.%d.0/24", 200+i))
		if err != nil {
			if sys == sysPlugin {
				rep.Correct = false
			}
			rep.Env.Done()
			return rep, fmt.Errorf("throughput, %s: %w", sys, err)
		}
		ends[sys] = e
		rep.MTU[sys] = mtuIn(e.sendNS, "eth0")
	}
	gbps := map[int]map[string][]float64{}
	ratio := map[int]map[string][]float64{}
	for _, n := range o.Streams {
		gbps[n], ratio[n] = map[string][]float64{}, map[string][]float64{}
	}
	for r := range o.Reps {
		for _, n := range o.Streams {
			got := map[string]float64{}
			for _, sys := range systems {
				e := ends[sys]
				w0, werr := o.wireBytes()
				res := tcpRun(e.sendNS, e.recvNS, e.dst, n, o.Duration)
				w1, werr1 := o.wireBytes()
				rep.Env.Sample()
				run := ThroughputRun{Rep: r, System: sys, Streams: n, Gbps: res.Gbps, Seconds: res.Seconds,
					Bytes: res.Streams, WireBytes: w1 - w0, Correct: res.Correct, Error: res.Error, Load: report.LoadAvg()}
				if werr = errors.Join(werr, werr1); werr != nil {
					run.Correct, run.Error = false, fmt.Sprintf("wire counter: %v", werr)
				} else if o.WireNS != "" && run.Correct && run.WireBytes < received(res.Streams) {
					run.Correct = false
					run.Error = fmt.Sprintf("%d bytes received, but only %d crossed the wire", received(res.Streams), run.WireBytes)
				}
				rep.Runs = append(rep.Runs, run)
				if sys == sysPlugin && !run.Correct {
					rep.Correct = false
				}
				if run.Correct {
					gbps[n][sys] = append(gbps[n][sys], run.Gbps)
					got[sys] = run.Gbps
				}
				o.Progress(fmt.Sprintf("throughput: rep %d: %d stream(s): %s %.2f Gbit/s in %.2f s, correct %v %s(load %s)",
					r+1, n, sys, run.Gbps, run.Seconds, run.Correct, run.Error, run.Load))
			}
			for _, sys := range systems[1:] {
				if p, s := got[sysPlugin], got[sys]; p > 0 && s > 0 {
					ratio[n][sys] = append(ratio[n][sys], p/s)
				}
			}
		}
	}
	for _, n := range o.Streams {
		c := ThroughputCase{Streams: n, Gbps: map[string]report.Stat{}, Ratio: map[string]report.Stat{}}
		for sys, v := range gbps[n] {
			c.Gbps[sys] = report.NewStat(v)
		}
		for sys, v := range ratio[n] {
			c.Ratio[sys] = report.NewStat(v)
		}
		rep.Cases = append(rep.Cases, c)
	}
	rep.Env.Done()
	return rep, nil
}

// wireBytes reads the wire counter (0 when there is none).
func (o Options) wireBytes() (uint64, error) {
	if o.WireNS == "" {
		return 0, nil
	}
	return rxBytes(o.WireNS, o.WireIf)
}

func received(ss []StreamBytes) uint64 {
	var n uint64
	for _, s := range ss {
		n += uint64(max(s.Received, 0))
	}
	return n
}

// tputContainers makes sys's network with a sender container on Nodes[0]
// and a receiver on Nodes[1], and waits until the sender reaches the
// receiver.
func (o Options) tputContainers(sys, subnet string) (tputEnd, error) {
	prefix, err := netip.ParsePrefix(subnet)
	if err != nil {
		return tputEnd{}, err
	}
	a := prefix.Addr().As4()
	a[3] = 10
	sendIP := netip.AddrFrom4(a)
	a[3] = 20
	recvIP := netip.AddrFrom4(a)
	network := "obs-tput-" + sys
	if err := o.createNetwork(sys, network, subnet); err != nil {
		return tputEnd{}, err
	}
	s, err := o.run(o.Nodes[0], "obs-send-"+sys, network, sendIP.String(), "sleep", "86400")
	if err != nil {
		return tputEnd{}, err
	}
	d, err := o.run(o.Nodes[1], "obs-recv-"+sys, network, recvIP.String(), "sleep", "86400")
	if err != nil {
		return tputEnd{}, err
	}
	e := tputEnd{sendNS: s.netns(), recvNS: d.netns(), dst: netip.AddrPortFrom(recvIP, tputPort)}
	ready := netip.AddrPortFrom(recvIP, readyPort)
	ln, err := listenIn(e.recvNS, ready.String())
	if err != nil {
		return tputEnd{}, err
	}
	defer ln.Close()
	return e, inNetNS(e.sendNS, func() error {
		_, _, err := connectLoop(ready, 100*time.Millisecond, o.ReachTimeout)
		return err
	})
}
