package kernelpath

import (
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Job is what one worker process runs.
type Job struct {
	// Figure: "peers" or "join".
	Figure string
	// System: "plugin", "moby", "raw" or "batch" (peers only).
	System   string
	Networks int
	// Peers in all, split evenly over the networks (peers).
	Peers int
	// Batch: peers per AddPeers call of the plugin (peers).
	Batch int
	// Joins: endpoints joined per way of the join figure.
	Joins int
	// StateDir: where the plugin keeps state.db (on the disk the plugin
	// would use, not tmpfs: its writes are synced).
	StateDir string
	// ParentNetNS is the inode of the spawner's network namespace: a
	// worker that finds itself there refuses to touch anything.
	ParentNetNS uint64
}

// Worker runs the job given as the argument after WorkerArg and prints
// its result as JSON. It is the whole of the worker process.
func Worker(arg string) error {
	var job Job
	if err := json.Unmarshal([]byte(arg), &job); err != nil {
		return err
	}
	if ino, err := netnsInode(); err != nil || ino == job.ParentNetNS {
		return fmt.Errorf("worker is not in a network namespace of its own (%v)", err)
	}
	if err := isolate(); err != nil {
		return err
	}
	var res any
	var err error
	switch job.Figure {
	case "peers":
		res, err = runPeers(job)
	case "join":
		res, err = runJoin(job)
	default:
		err = fmt.Errorf("unknown figure %q", job.Figure)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func netnsInode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
