package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/slogtest"
)

// dockerd logs a plugin's stdout at info and its stderr at error: INFO and
// DEBUG must go to stdout, WARN and ERROR to stderr, attributes and groups
// intact either way.
func TestServeLoggerSplitsByLevel(t *testing.T) {
	var stdout, stderr bytes.Buffer
	log := newServeLogger(&stdout, &stderr, slog.LevelDebug).With("component", "cluster").WithGroup("peer").With("addr", "198.51.100.2")
	log.Debug("probe", "rtt", "1ms")
	log.Info("joined", "members", 2)
	log.Warn("suspect", "for", "5s")
	log.Error("failed", "err", "timeout")
	log.Log(t.Context(), slog.LevelInfo+2, "between info and warn")
	log.Log(t.Context(), slog.LevelError+4, "above error")

	lines := func(b *bytes.Buffer) []string { return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") }
	want := func(name string, got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d lines, want %d:\n%s", name, len(got), len(want), strings.Join(got, "\n"))
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s line %d: %q lacks %q", name, i, got[i], w)
			}
		}
	}
	want("stdout", lines(&stdout),
		`level=DEBUG msg=probe component=cluster peer.addr=198.51.100.2 peer.rtt=1ms`,
		`level=INFO msg=joined component=cluster peer.addr=198.51.100.2 peer.members=2`,
		`level=INFO+2 msg="between info and warn" component=cluster peer.addr=198.51.100.2`)
	want("stderr", lines(&stderr),
		`level=WARN msg=suspect component=cluster peer.addr=198.51.100.2 peer.for=5s`,
		`level=ERROR msg=failed component=cluster peer.addr=198.51.100.2 peer.err=timeout`,
		`level=ERROR+4 msg="above error" component=cluster peer.addr=198.51.100.2`)
}

// The level applies to both streams.
func TestServeLoggerLevel(t *testing.T) {
	var stdout, stderr bytes.Buffer
	log := newServeLogger(&stdout, &stderr, slog.LevelWarn)
	log.Debug("d")
	log.Info("i")
	log.Warn("w")
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "level=WARN msg=w") {
		t.Errorf("at level WARN: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	log = newServeLogger(&stdout, &stderr, slog.LevelInfo)
	log.Debug("d")
	log.Error("e")
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "level=ERROR msg=e") {
		t.Errorf("at level INFO: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// levelSplit is a well-behaved slog.Handler (testing/slogtest), here with
// both halves writing JSON to one buffer.
func TestLevelSplitHandler(t *testing.T) {
	var buf bytes.Buffer
	slogtest.Run(t, func(*testing.T) slog.Handler {
		buf.Reset()
		return newLevelSplit(slog.NewJSONHandler(&buf, nil), slog.NewJSONHandler(&buf, nil))
	}, func(t *testing.T) map[string]any {
		m := map[string]any{}
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	})
}

// `overlay-plugin serve` logs through that split: its start on stdout, the
// error that stops it on stderr.
func TestServeLogsToBothStreams(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"serve", "--socket", filepath.Join(notDir, "plugin.sock"), "--state-dir", dir, "--gossip-port", "0"},
		func(string) string { return "" }, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit status %d, want 1; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `level=INFO msg="overlay plugin starting"`) || strings.Contains(stdout.String(), "level=ERROR") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), `level=ERROR msg="overlay plugin stopped"`) || strings.Contains(stderr.String(), "level=INFO") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
}
