package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"golang.org/x/sys/unix"
)

// Default bounds of a plugin's life cycle.
const (
	PluginStartTimeout = 20 * time.Second
	PluginStopTimeout  = 10 * time.Second
	buildTimeout       = 5 * time.Minute
)

var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// PluginBinary returns the plugin binary to test: $OVERLAY_PLUGIN_BIN if
// set, else one built (once per process) with `go build ./cmd/overlay-plugin`
// in the module root. RemoveBuiltPlugin deletes the build.
func PluginBinary() (string, error) {
	if p := os.Getenv("OVERLAY_PLUGIN_BIN"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if st, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("OVERLAY_PLUGIN_BIN: %w", err)
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("OVERLAY_PLUGIN_BIN=%s is not an executable file", abs)
		}
		return abs, nil
	}
	built.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			built.err = err
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "ovtb-bin")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		out := filepath.Join(dir, "overlay-plugin")
		args := []string{"build", "-o", out}
		if lockrank.Checking {
			// A suite that checks the lock order checks its plugins' too.
			args = append(args, "-tags", "lockrank")
		}
		cmd := exec.Command(goBin, append(args, "./cmd/overlay-plugin")...)
		cmd.Dir = root
		done := make(chan struct{})
		var output []byte
		go func() { output, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(buildTimeout):
			_ = cmd.Process.Kill()
			<-done
			err = fmt.Errorf("timed out after %v", buildTimeout)
		}
		if err != nil {
			built.err = fmt.Errorf("go build ./cmd/overlay-plugin in %s: %v: %s", root, err, strings.TrimSpace(string(output)))
			return
		}
		built.path = out
	})
	return built.path, built.err
}

// RemoveBuiltPlugin deletes the binary PluginBinary built, if any.
func RemoveBuiltPlugin() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

// ModuleRoot finds the directory of go.mod, walking up from the working
// directory (a package directory under `go test`).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			wd, _ := os.Getwd()
			return "", fmt.Errorf("testbed: no go.mod above the working directory %s to build the plugin in; set OVERLAY_PLUGIN_BIN", wd)
		}
		dir = parent
	}
}

// PluginConfig adjusts how StartPlugin runs the plugin. The zero value is
// the default.
type PluginConfig struct {
	// Bin is the binary; empty means PluginBinary().
	Bin string
	// VXLANPort, when not 0, is passed as --vxlan-port.
	VXLANPort int
	// Args are extra flags after the defaults.
	Args []string
	// Env is added to the test process's environment.
	Env []string
	// StartTimeout bounds the wait for the sockets and /healthz.
	StartTimeout time.Duration
	// SandboxesOutlive keeps the plugin in the test's mount namespace
	// (nsenter --net, not `ip netns exec`, which gives it a private one),
	// so its sandbox mounts, and with them the sandboxes and the
	// containers' interfaces, outlive the process as a managed plugin's
	// do on the host's /run/overlay-plugin. The Bed unmounts what is left
	// at cleanup.
	SandboxesOutlive bool
	// OnSocket, if set, is called once as soon as the Docker API socket
	// accepts a connection, before /healthz is awaited: dockerd dials a
	// plugin's socket until it answers and calls it at once (calls made
	// before the plugin is ready wait for it). An error fails StartPlugin.
	OnSocket func(*Plugin) error
}

// Plugin is a running (or exited) plugin process on a host. Its files live
// in the host's directory, so a plugin started again on the host (after
// Stop or Kill) finds the previous one's state.
type Plugin struct {
	Host        *Host
	Socket      string
	AdminSocket string
	StateDir    string
	SandboxDir  string
	LogFile     string
	// API speaks the Docker plugin protocol, Admin the admin API.
	API   *Client
	Admin *adminapi.Client

	cmd     *exec.Cmd
	logf    *os.File
	done    chan struct{}
	waitErr error
	dumped  bool // Stop killed it with SIGQUIT: its log ends in its stacks
}

// spawner starts processes from one OS thread that lives as long as this
// process, so the Pdeathsig of its children (a signal on the death of the
// parent *thread*) fires only when the test process dies: a crashed or
// timed-out test binary takes its plugins with it.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

func startFromSpawner(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread stays
			for r := range spawner.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, errc}
	return <-errc
}

// StartPlugin starts `overlay-plugin serve` inside the host's namespace with
// all its paths under the host's directory, its VTEP at the host's underlay
// address and debug logs to LogFile, and waits until both sockets exist and
// /healthz answers 200. The Bed stops it at cleanup (and dumps the log tail
// if the test failed).
func (h *Host) StartPlugin(cfg PluginConfig) (*Plugin, error) {
	b := h.topo.Bed
	if b.closed() {
		return nil, errors.New("testbed: Bed is cleaned up")
	}
	bin := cfg.Bin
	if bin == "" {
		var err error
		if bin, err = PluginBinary(); err != nil {
			return nil, err
		}
	}
	p := &Plugin{
		Host:        h,
		Socket:      filepath.Join(h.Dir, "plugin.sock"),
		AdminSocket: filepath.Join(h.Dir, "admin.sock"),
		StateDir:    filepath.Join(h.Dir, "state"),
		SandboxDir:  filepath.Join(h.Dir, "sandbox"),
		LogFile:     filepath.Join(h.Dir, "plugin.log"),
		done:        make(chan struct{}),
	}
	p.API, p.Admin = NewClient(p.Socket), adminapi.NewClient(p.AdminSocket)
	// A previous process's sockets would answer nothing; a stale file must
	// not be mistaken for readiness.
	for _, s := range []string{p.Socket, p.AdminSocket} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	logf, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p.logf = logf
	launcher := []string{"ip", "netns", "exec", h.NS.Name}
	if cfg.SandboxesOutlive {
		launcher = []string{"nsenter", "--net=" + h.NS.Path(), "--"}
		b.onCleanup("unmount the sandboxes left on "+h.Name, func() error { return unmountSandboxes(p.SandboxDir) })
	}
	args := append(launcher, bin, "serve",
		"--socket", p.Socket,
		"--state-dir", p.StateDir,
		"--sandbox-dir", p.SandboxDir,
		"--admin-socket", p.AdminSocket,
		"--advertise-addr", h.Underlay.String(),
		"--log-level", "debug",
	)
	if cfg.VXLANPort != 0 {
		args = append(args, "--vxlan-port", strconv.Itoa(cfg.VXLANPort))
	}
	args = append(args, cfg.Args...)
	fmt.Fprintf(logf, "=== testbed %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), cfg.Env...)
	// `ip netns exec` and nsenter exec the plugin in place: cmd's PID is
	// the plugin's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd = cmd
	if err := startFromSpawner(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start plugin on %s: %w", h.Name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		fmt.Fprintf(logf, "=== testbed %s: pid %d exited: %v\n", time.Now().Format(time.RFC3339Nano), cmd.Process.Pid, exitText(p.waitErr))
		close(p.done)
	}()
	b.onCleanup(fmt.Sprintf("stop plugin pid %d on %s", cmd.Process.Pid, h.Name), p.cleanup)

	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = PluginStartTimeout
	}
	if err := p.waitReady(timeout, cfg.OnSocket); err != nil {
		return p, fmt.Errorf("plugin on %s (pid %d) not ready: %w\n--- log tail ---\n%s", h.Name, p.Pid(), err, p.LogTail(40))
	}
	return p, nil
}

// unmountSandboxes detaches the sandbox mounts a plugin left in dir, each
// a network namespace: the last reference to it, so the namespace goes
// with its devices; those in its subdirectories (the health endpoints')
// too.
func unmountSandboxes(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if e.IsDir() {
			errs = append(errs, unmountSandboxes(path))
			continue
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Plugin) waitReady(timeout time.Duration, onSocket func(*Plugin) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited during start-up: %s", exitText(p.waitErr))
		default:
		}
		if onSocket != nil && p.accepting() {
			f := onSocket
			onSocket = nil
			if err := f(p); err != nil {
				return fmt.Errorf("OnSocket: %w", err)
			}
		}
		last = p.readyOnce()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, last)
		}
		if onSocket != nil {
			time.Sleep(time.Millisecond) // catch the socket early, as dockerd does
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// accepting reports whether the Docker API socket takes a connection. The
// socket file exists from bind(2), a moment before listen(2): a connect in
// between is refused.
func (p *Plugin) accepting() bool {
	c, err := net.DialTimeout("unix", p.Socket, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (p *Plugin) readyOnce() error {
	for _, s := range []string{p.Socket, p.AdminSocket} {
		if st, err := os.Stat(s); err != nil {
			return err
		} else if st.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s is not a socket", s)
		}
	}
	ok, err := p.Admin.Healthy()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("/healthz: not ready (503)")
	}
	return nil
}

// Network returns the plugin's state of one network, from the admin API.
func (p *Plugin) Network(id string) (driver.NetworkState, error) {
	all, err := p.Admin.Networks()
	if err != nil {
		return driver.NetworkState{}, err
	}
	for _, n := range all {
		if n.ID == id {
			return n, nil
		}
	}
	return driver.NetworkState{}, fmt.Errorf("plugin on %s lists no network %s (%d networks)", p.Host.Name, id, len(all))
}

// Pid is the plugin process's PID.
func (p *Plugin) Pid() int { return p.cmd.Process.Pid }

// Running reports whether the process has not exited yet.
func (p *Plugin) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// error (nil for status 0).
func (p *Plugin) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(timeout):
		return fmt.Errorf("plugin pid %d still running after %v", p.Pid(), timeout)
	}
}

// Stop sends SIGTERM and waits up to timeout (0: PluginStopTimeout) for a
// clean exit; a plugin still running then is killed (SIGQUIT, for its
// stacks, then SIGKILL) and an error returned. The result is nil only for exit status 0.
func (p *Plugin) Stop(timeout time.Duration) error {
	if timeout == 0 {
		timeout = PluginStopTimeout
	}
	if !p.Running() {
		return p.waitErr
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGTERM pid %d: %w", p.Pid(), err)
	}
	select {
	case <-p.done:
		if p.waitErr != nil {
			return fmt.Errorf("plugin pid %d on SIGTERM: %s", p.Pid(), exitText(p.waitErr))
		}
		return nil
	case <-time.After(timeout):
	}
	// SIGQUIT first: the Go runtime writes every goroutine's stack to the
	// log, which names what held the shutdown.
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	p.dumped = true
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	return fmt.Errorf("plugin pid %d ignored SIGTERM for %v; killed (goroutine dump in %s)", p.Pid(), timeout, p.LogFile)
}

// Kill SIGKILLs the process (a crash) and waits for it to be reaped.
func (p *Plugin) Kill() error {
	if !p.Running() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGKILL pid %d: %w", p.Pid(), err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(PluginStopTimeout):
		return fmt.Errorf("plugin pid %d not reaped %v after SIGKILL", p.Pid(), PluginStopTimeout)
	}
}

func (p *Plugin) cleanup() error {
	var err error
	if p.Running() {
		if serr := p.Stop(0); serr != nil {
			// Only a plugin that had to be killed fails the cleanup; an
			// unclean exit is logged (the test checks Stop itself).
			if p.Running() || strings.Contains(serr.Error(), "ignored SIGTERM") {
				err = serr
			} else {
				p.Host.topo.Bed.Logf("plugin on %s at cleanup: %v", p.Host.Name, serr)
			}
		}
	}
	if p.Host.topo.Bed.failed() {
		lines := 60
		if p.dumped {
			lines = 1000 // the goroutine dump
		}
		p.Host.topo.Bed.Logf("plugin on %s (pid %d) log tail, %s:\n%s", p.Host.Name, p.Pid(), p.LogFile, p.LogTail(lines))
	}
	p.logf.Close()
	p.Admin.Close()
	return err
}

// Log returns the whole log file (every run on this host).
func (p *Plugin) Log() string {
	b, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.LogFile, err)
	}
	return string(b)
}

// LogTail returns the last n lines of the log.
func (p *Plugin) LogTail(n int) string {
	f, err := os.Open(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.LogFile, err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// HealthDir is the subdirectory of the sandbox directory where the plugin
// keeps its data-path probes' endpoints for as long as it runs (package
// health); Mounts and SandboxFiles leave it out: they are the networks'.
const HealthDir = "health"

// Mounts lists the mount points of the networks' sandboxes under the
// sandbox directory in the plugin's mount namespace (`ip netns exec` gives
// it a private one, so these are not visible from the test's own). It
// needs the process to be running.
func (p *Plugin) Mounts() ([]string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", p.Pid()))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == p.SandboxDir || strings.HasPrefix(f[4], p.SandboxDir+"/")) &&
			!strings.HasPrefix(f[4], filepath.Join(p.SandboxDir, HealthDir)+"/") {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// HoldSandboxes bind-mounts the plugin's sandbox namespaces, from its
// private mount namespace, onto the same paths in this process's. That is
// where a managed plugin's sandboxes are, on a host mount: they outlive
// the process, and a plugin started again on the host (`ip netns exec`
// copies this mount namespace) finds and adopts them. The Bed unmounts
// what is left at cleanup. The plugin must be running.
func (p *Plugin) HoldSandboxes() error {
	mounts, err := p.Mounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		src := fmt.Sprintf("/proc/%d/root%s", p.Pid(), m)
		if err := unix.Mount(src, m, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("hold sandbox %s: %w", m, err)
		}
		p.Host.topo.Bed.onCleanup("unmount held sandbox "+m, func() error {
			// The plugin deleting the sandbox unlinks the file, which
			// detaches this mount too.
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return err
			}
			return nil
		})
	}
	return nil
}

// SandboxPath is where a sandbox namespace of the plugin can be opened from
// this process: its bind mount lives in the plugin's private mount
// namespace, reached through /proc/PID/root. The plugin must be running.
func (p *Plugin) SandboxPath(sandbox string) string {
	return fmt.Sprintf("/proc/%d/root%s", p.Pid(), filepath.Join(p.SandboxDir, sandbox))
}

// SandboxExec runs a command (e.g. "bridge", "fdb", "show") inside one of the
// plugin's sandbox namespaces, for checking the data path independently of
// the plugin's own report. Needs nsenter (util-linux).
func (p *Plugin) SandboxExec(sandbox string, args ...string) (string, error) {
	return Run(append([]string{"nsenter", "--net=" + p.SandboxPath(sandbox), "--"}, args...)...)
}

// SandboxFiles lists the entries of the sandbox directory (absent counts
// as empty).
func (p *Plugin) SandboxFiles() ([]string, error) {
	entries, err := os.ReadDir(p.SandboxDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !(e.IsDir() && e.Name() == HealthDir) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
	}
	return err.Error()
}
