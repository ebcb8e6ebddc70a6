package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

// stubUnderlay is a host with one interface, stubVTEP, MTU 1500.
type stubUnderlay struct{}

var stubVTEP = netip.MustParseAddr("198.51.100.1")

func (stubUnderlay) DefaultAddr() (netip.Addr, error) { return stubVTEP, nil }
func (stubUnderlay) MTU(netip.Addr) (int, error)      { return 1500, nil }

// testLogger writes to the test log, so failures show the plugin's view.
// memberlist's goroutines may outlive Shutdown by a moment: what they log
// after the test is over is dropped.
func testLogger(t *testing.T) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct {
	t *testing.T
	// mu guards done, and is held while logging so the test cannot end
	// between the check and the write. Leaf lock.
	mu   sync.Mutex
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Helper()
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

type testDriver struct {
	drv    *driver.Driver
	kernel *fakekernel.Kernel
	vnis   *vni.Allocator
}

func newTestDriver(t *testing.T) testDriver {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), stateDBName), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	vnis, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		t.Fatal(err)
	}
	k := fakekernel.New()
	d, err := driver.New(driver.Config{Kernel: k, Underlay: stubUnderlay{}, VNIs: vnis, VXLANPort: 4789, AdvertiseAddr: stubVTEP, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return testDriver{d, k, vnis}
}

// reply is an HTTP answer.
type reply struct {
	status      int
	contentType string
	body        []byte
}

func post(t *testing.T, c *http.Client, base, path string, body any) reply {
	t.Helper()
	r, err := tryPost(c, base, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryPost is post for goroutines other than the test's.
func tryPost(c *http.Client, base, path string, body any) (reply, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(data)
	}
	resp, err := c.Post(base+path, "application/json", rd)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: %w", path, err)
	}
	return reply{resp.StatusCode, resp.Header.Get("Content-Type"), data}, nil
}

// ok decodes a successful answer into out (unless nil).
func (r reply) ok(t *testing.T, what string, out any) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s", what, r.status, r.body)
	}
	if out == nil {
		return
	}
	if err := json.Unmarshal(r.body, out); err != nil {
		t.Fatalf("%s: decode %s: %v", what, r.body, err)
	}
}

// errMsg checks that r is an error answer {"Err": "..."} and returns the
// message.
func (r reply) errMsg(t *testing.T, what string) string {
	t.Helper()
	if r.status < 400 {
		t.Fatalf("%s: HTTP %d %s, want an error", what, r.status, r.body)
	}
	if r.contentType != pluginContentType {
		t.Errorf("%s: Content-Type %q, want %q", what, r.contentType, pluginContentType)
	}
	var e struct{ Err string }
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Err == "" {
		t.Fatalf("%s: body %q is not {\"Err\": \"...\"}: %v", what, r.body, err)
	}
	return e.Err
}
