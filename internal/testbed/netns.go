package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// netnsDir is where `ip netns add` mounts named namespaces.
const netnsDir = "/run/netns"

// Netns is a named network namespace made by `ip netns add`.
type Netns struct {
	// Name is the full name under /run/netns.
	Name string
	bed  *Bed
}

// NewNetns creates a namespace named runPrefix+<bed number>+"-"+name, brings
// its loopback up and records its deletion. Keep name short and unique in
// the Bed (letters and digits).
func (b *Bed) NewNetns(name string) (*Netns, error) {
	if b.closed() {
		return nil, errors.New("testbed: Bed is cleaned up")
	}
	full := b.prefix + "-" + name
	if _, err := Run("ip", "netns", "add", full); err != nil {
		return nil, err
	}
	n := &Netns{Name: full, bed: b}
	b.onCleanup("delete netns "+full, n.Delete)
	if _, err := n.IP("link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	return n, nil
}

// Path is the namespace's bind mount, what Docker calls the SandboxKey.
func (n *Netns) Path() string { return filepath.Join(netnsDir, n.Name) }

// Exec runs a command inside the namespace (`ip netns exec`) and returns
// its combined output.
func (n *Netns) Exec(args ...string) (string, error) {
	return Run(append([]string{"ip", "netns", "exec", n.Name}, args...)...)
}

// IP runs `ip -n NS args...`.
func (n *Netns) IP(args ...string) (string, error) {
	return Run(append([]string{"ip", "-n", n.Name}, args...)...)
}

// Sysctl sets a sysctl (dotted key, e.g. net.ipv6.conf.all.forwarding)
// inside the namespace.
func (n *Netns) Sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	_, err := n.Exec("sh", "-c", `echo "$1" > "$2"`, "sh", value, path)
	return err
}

// Do runs fn on an OS thread switched into the namespace (nsthread.Do).
// Sockets that fn opens belong to the namespace for their whole life and
// may be used from any goroutine afterwards. fn must not start goroutines
// that expect to be in the namespace.
func (n *Netns) Do(fn func() error) error {
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	defer h.Close()
	return nsthread.Do(h, fn)
}

// Pids lists the processes running in the namespace.
func (n *Netns) Pids() ([]int, error) {
	out, err := Run("ip", "netns", "pids", n.Name)
	if err != nil {
		return nil, err
	}
	return parsePids(out), nil
}

// Delete removes the namespace. Processes still in it are ones this Bed's
// processes started (nothing else can enter it): they are killed by PID
// first, and reported, since a clean test leaves none. Deleting a namespace
// that is gone already is not an error.
func (n *Netns) Delete() error {
	if _, err := os.Stat(n.Path()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	if pids, err := n.Pids(); err == nil && len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes left in netns %s: %v (killed)", n.Name, pids))
		killPids(pids)
	}
	if _, err := Run("ip", "netns", "delete", n.Name); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func parsePids(s string) []int {
	var pids []int
	for _, f := range strings.Fields(s) {
		if p, err := strconv.Atoi(f); err == nil && p > 1 && p != os.Getpid() {
			pids = append(pids, p)
		}
	}
	return pids
}

// killPids SIGKILLs each PID and waits (bounded) for it to disappear.
func killPids(pids []int) {
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range pids {
		for time.Now().Before(deadline) {
			if syscall.Kill(p, 0) != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Namespaces lists the namespaces of this process (named with Prefix)
// that exist now.
func Namespaces() ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), runPrefix) {
			out = append(out, e.Name())
		}
	}
	return out, err
}

// Sweep deletes every namespace whose name starts with this process's
// Prefix, killing (by PID) the processes still inside. For a TestMain's
// exit path, after a crash or a forgotten Cleanup.
func Sweep() error {
	return sweep(func(name string) bool { return strings.HasPrefix(name, runPrefix) })
}

// SweepStale deletes namespaces that earlier runs of this package left:
// names "ovtb<pid>-..." whose pid no longer exists.
func SweepStale() error {
	return sweep(func(name string) bool {
		rest, ok := strings.CutPrefix(name, "ovtb")
		if !ok {
			return false
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		if !ok {
			return false
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			return false
		}
		_, err = os.Stat(fmt.Sprintf("/proc/%d", pid))
		return errors.Is(err, os.ErrNotExist)
	})
}

func sweep(match func(string) bool) error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	// Reverse order: containers and hosts were made after the switch.
	for i := len(entries) - 1; i >= 0; i-- {
		name := entries[i].Name()
		if !match(name) {
			continue
		}
		n := &Netns{Name: name}
		if pids, err := n.Pids(); err == nil && len(pids) > 0 {
			killPids(pids)
		}
		if _, err := Run("ip", "netns", "delete", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Check reports why this machine cannot run testbed networks, or nil: it
// needs root, iproute2's ip, and network namespaces with veth, bridge and
// vxlan (tried in a throwaway namespace).
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, veth, vxlan)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("needs iproute2's ip command in PATH")
	}
	name := fmt.Sprintf("%sprobe", runPrefix)
	if out, err := Run("ip", "netns", "add", name); err != nil {
		return fmt.Errorf("cannot create a network namespace: %s", strings.TrimSpace(out))
	}
	defer Run("ip", "netns", "delete", name) //nolint:errcheck
	probes := []struct {
		what string
		args []string
	}{
		{"veth", []string{"link", "add", "pv0", "type", "veth", "peer", "name", "pv1"}},
		{"bridge", []string{"link", "add", "pbr0", "type", "bridge"}},
		{"vxlan", []string{"link", "add", "pvx0", "type", "vxlan", "id", "42", "dstport", "4789", "local", "127.0.0.1", "nolearning"}},
	}
	for _, p := range probes {
		if out, err := Run(append([]string{"ip", "-n", name}, p.args...)...); err != nil {
			return fmt.Errorf("kernel lacks %s interfaces: %s", p.what, strings.TrimSpace(out))
		}
	}
	return nil
}
