package demo

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "demo") }

// The demo installs missing packages; its test only runs where they are.
var testbedReq = testbed.NewRequirement("demo", func() error {
	for _, t := range tools {
		if _, err := exec.LookPath(t.cmd); err != nil {
			return errors.New("needs " + t.cmd + " (Debian package " + t.pkg + ")")
		}
	}
	return nil
})

// TestDemo runs the whole demo as `make demo DEMO_ARGS=--keep` does and,
// while it is kept, interrupts it as Ctrl-C does: every ping was answered,
// the output says what the demo shows, and nothing is left behind.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole demo, with the real plugin: not in -short")
	}
	testbedReq.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdin := &heldReader{reading: make(chan struct{}), release: make(chan struct{})}
	defer close(stdin.release)
	out := &lockedBuffer{}
	type result struct {
		res Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := Run(ctx, Config{Out: out, Keep: true, Stdin: stdin})
		done <- result{res, err}
	}()
	select {
	case <-stdin.reading:
	case r := <-done:
		t.Fatalf("Run returned before pausing: %v\n%s", r.err, out)
	case <-time.After(3 * time.Minute):
		t.Fatalf("the demo did not pause within 3 minutes:\n%s", out)
	}

	// Kept: the plugins run and the namespaces are there.
	text := out.String()
	pids := matches(t, text, `h\d: pid (\d+),`, 3)
	for _, pid := range pids {
		if err := syscall.Kill(atoi(t, pid), 0); err != nil {
			t.Errorf("plugin pid %s while kept: %v", pid, err)
		}
	}
	if ns, err := testbed.Namespaces(); err != nil || len(ns) != 7 {
		t.Errorf("namespaces while kept: %v %v, want the switch, 3 hosts, 3 containers", ns, err)
	}
	for _, want := range []string{
		`GetCapabilities -> {"Scope":"global","ConnectivityScope":"global"}`,
		`AllocateNetwork on h1 (the swarm leader) -> options {"com.docker.network.driver.mtu":"1450","vxlanid_list":"`,
		"every host knows the other 2 endpoints",
		"h2 sees: h1=alive@198.51.100.1  h2(self)=alive@198.51.100.2  h3=alive@198.51.100.3\n",
		"neigh 203.0.113.12    lladdr 02:42:cb:00:71:0c dev vxlan0 permanent",
		"fdb   02:42:cb:00:71:0b dst 198.51.100.1 dev vxlan0 self permanent",
		"ok    c3 (h3) -> c1 (h1)  2001:db8:1::11\n",
		"pings: 12 passed, 0 failed (of 12)",
		"kill -KILL " + pids[2],
		"Press Enter to clean up.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}

	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("the demo did not end within a minute of its interruption:\n%s", out)
	}
	text = out.String()
	if !errors.Is(r.err, context.Canceled) || r.res.Passed != 12 || r.res.Failed != 0 {
		t.Errorf("Run = %+v, %v; want 12 pings passed, then context.Canceled", r.res, r.err)
	}
	if !strings.HasSuffix(text, "\ndemo: interrupted\n") || strings.Contains(text, "\x1b[") {
		t.Errorf("output does not end with the interruption, or has colours")
	}

	// Nothing left: processes, namespaces, the scratch directory.
	for _, pid := range pids {
		if err := syscall.Kill(atoi(t, pid), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("plugin pid %s after the demo: %v, want it gone", pid, err)
		}
	}
	if ns, err := testbed.Namespaces(); err != nil || len(ns) != 0 {
		t.Errorf("namespaces left: %v %v", ns, err)
	}
	dir := matches(t, text, `removed (/\S+)`, 1)[0]
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch directory %s left: %v", dir, err)
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", text)
	}
}

// matches returns the first group of each match of re in text, and wants n.
func matches(t *testing.T, text, re string, n int) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	if len(out) != n {
		t.Fatalf("output has %d matches of %s, want %d:\n%s", len(out), re, n, text)
	}
	return out
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// heldReader is a terminal nobody types into: a Read says it started,
// then blocks until release.
type heldReader struct {
	once             sync.Once
	reading, release chan struct{}
}

func (h *heldReader) Read([]byte) (int, error) {
	h.once.Do(func() { close(h.reading) })
	<-h.release
	return 0, io.EOF
}

// lockedBuffer is the demo's output, read while the demo writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
