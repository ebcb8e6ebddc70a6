package report

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
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

// LoadAvg is /proc/loadavg's 1, 5 and 15-minute figures.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func load1() float64 {
	var v float64
	fmt.Sscan(LoadAvg(), &v)
	return v
}

// NewEnv describes the machine now.
func NewEnv() Env {
	k, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	c, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	return Env{Started: time.Now().UTC(), Go: runtime.Version(), Kernel: strings.TrimSpace(string(k)),
		CPUs: runtime.NumCPU(), Commit: strings.TrimSpace(string(c)), LoadBefore: LoadAvg(), MaxLoad1: load1()}
}

// Sample notes the load between runs; Done at the end.
func (e *Env) Sample() { e.MaxLoad1 = max(e.MaxLoad1, load1()) }
func (e *Env) Done()   { e.LoadAfter = LoadAvg(); e.Sample() }

// Line is the report's sentence about the machine and its load.
func (e Env) Line(reps int) string {
	return fmt.Sprintf("%d repetition(s), interleaved; started %s; %s, kernel %s, %d CPUs, commit %s; load average before %s, after %s, highest 1-min between runs %.2f.",
		reps, e.Started.Format("2006-01-02 15:04 UTC"), e.Go, e.Kernel, e.CPUs, e.Commit, e.LoadBefore, e.LoadAfter, e.MaxLoad1)
}
