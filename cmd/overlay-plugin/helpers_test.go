package main

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
)

// stubUnderlay is a host with one interface, stubVTEP, MTU 1500.
var (
	stubVTEP     = drivertest.VTEP
	stubUnderlay = drivertest.Underlay{Addr: stubVTEP}
)

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
