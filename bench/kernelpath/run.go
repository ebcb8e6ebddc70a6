package kernelpath

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Options configure Run.
type Options struct {
	Reps int
	// PeerCounts and NetworkCounts span the peers figure's settings.
	PeerCounts, NetworkCounts []int
	Batch                     int
	// Systems of the peers figure; the first is the one the others are
	// compared with. The join figure runs plugin and moby.
	Systems []string
	// JoinNetworks and Joins set the join figure.
	JoinNetworks, Joins int
	// StateDir holds the plugin's state.db during a join run.
	StateDir string
	Progress func(string)
}

// DefaultOptions are make bench's.
func DefaultOptions() Options {
	return Options{Reps: 3, PeerCounts: []int{10000, 50000}, NetworkCounts: []int{1, 8}, Batch: 512,
		Systems: []string{"plugin", "moby", "raw", "batch"}, JoinNetworks: 10, Joins: 50}
}

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

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func load1() float64 {
	var v float64
	fmt.Sscan(loadavg(), &v)
	return v
}

func newEnv() Env {
	k, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	c, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return Env{Started: time.Now().UTC(), Go: runtime.Version(), Kernel: strings.TrimSpace(string(k)),
		CPUs: runtime.NumCPU(), Commit: strings.TrimSpace(string(c)), LoadBefore: loadavg(), MaxLoad1: load1()}
}

func (e *Env) sample() { e.MaxLoad1 = max(e.MaxLoad1, load1()) }
func (e *Env) done()   { e.LoadAfter = loadavg(); e.sample() }

// Stat is min, median and max of a sample.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func stat(v []float64) Stat {
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
	return fmt.Sprintf("%s / %s / %s", num(s.Min), num(s.Median), num(s.Max))
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func parentNetNS() uint64 {
	ino, _ := netnsInode()
	return ino
}

func stateDir(o Options, tag string) string {
	return filepath.Join(o.StateDir, fmt.Sprintf("%s-%d-%d", tag, os.Getpid(), time.Now().UnixNano()))
}
