// Package kernelpath measures the data path's programming against real
// kernels: peers programmed per second (this plugin's driver, Docker's
// overlay driver from moby, a raw synchronous netlink loop, and ip/bridge
// -batch) and Join latency (both drivers). Every run is a child process of
// its own in a new network namespace and a private mount namespace with
// tmpfs over the paths the drivers write (/run/docker, /var/run/docker,
// the neighbour-table sysctls), so nothing of the machine is touched and
// everything goes with the process.
package kernelpath

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// localVTEP is every run's own address, on lo inside its namespace (RFC
// 2544's benchmark range); the remote VTEPs need no route: nothing is sent.
const localVTEP = "198.18.0.1"

// WorkerArg is the first argument that makes the benchmark's binary a
// worker (see Worker).
const WorkerArg = "kernelpath-worker"

// spawn runs job in a child process of this binary in fresh network and
// mount namespaces, and decodes its JSON result into out.
func spawn(job Job, out any) error {
	arg, err := json.Marshal(job)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, WorkerArg, string(arg))
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS,
		Pdeathsig:  syscall.SIGKILL,
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s worker: %w: %s", job.System, err, lastLines(stderr.String()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("%s worker: result: %w: %s", job.System, err, lastLines(stderr.String()))
	}
	return nil
}

func lastLines(s string) string {
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}

// isolate prepares a worker's namespaces: no mount propagates back, tmpfs
// over the drivers' state paths, files over the neighbour sysctls moby
// raises (global, where a namespace shows them), lo up with the local VTEP.
func isolate() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	for _, dir := range []string{"/run/docker", "/var/run/docker", "/run/overlay-bench"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", dir, err)
		}
	}
	for _, k := range []string{"gc_thresh1", "gc_thresh2", "gc_thresh3"} {
		p := "/proc/sys/net/ipv4/neigh/default/" + k
		v, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // only the first namespace has them: nothing to cover
		}
		if err != nil {
			return err
		}
		stand := filepath.Join("/run/overlay-bench", k)
		if err := os.WriteFile(stand, v, 0o644); err != nil {
			return err
		}
		if err := unix.Mount(stand, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("cover %s: %w", p, err)
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	addr, _ := netlink.ParseAddr(localVTEP + "/32")
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	if err := netlink.AddrAdd(lo, addr); err != nil {
		return fmt.Errorf("local VTEP on lo: %w", err)
	}
	return nil
}
