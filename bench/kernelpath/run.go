package kernelpath

import (
	"fmt"
	"os"
	"path/filepath"
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

func parentNetNS() uint64 {
	ino, _ := netnsInode()
	return ino
}

func stateDir(o Options, tag string) string {
	return filepath.Join(o.StateDir, fmt.Sprintf("%s-%d-%d", tag, os.Getpid(), time.Now().UnixNano()))
}
