package cluster

import (
	"context"
	"log"
	"log/slog"
	"testing"
)

// recordHandler keeps the records it is handed.
type recordHandler struct{ recs *[]slog.Record }

func (recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	*h.recs = append(*h.recs, r)
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// memberlist's lines keep their level: the plugin routes WARN and ERROR to
// stderr, which dockerd logs as errors, and the rest to stdout.
func TestMemberlistLogLevels(t *testing.T) {
	var recs []slog.Record
	l := log.New(&mlLogWriter{log: slog.New(recordHandler{&recs})}, "", 0)
	for _, c := range []struct {
		line  string
		level slog.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=198.51.100.2:7947", slog.LevelDebug, "Stream connection from=198.51.100.2:7947"},
		{"[INFO] memberlist: Marking n2 as failed, suspect timeout reached (0 peer confirmations)", slog.LevelInfo, "Marking n2 as failed, suspect timeout reached (0 peer confirmations)"},
		{"[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed, network may be misconfigured", slog.LevelWarn, "Was able to connect to n2 over TCP but UDP probes failed, network may be misconfigured"},
		{"[ERR] memberlist: Failed to send ping: write: broken pipe", slog.LevelError, "Failed to send ping: write: broken pipe"},
		{"[ERROR] memberlist: Failed to encrypt local state: x", slog.LevelError, "Failed to encrypt local state: x"},
		{"Err: Could not set the deadline: x", slog.LevelError, "Could not set the deadline: x"},
		{"no prefix at all", slog.LevelInfo, "no prefix at all"},
	} {
		recs = nil
		l.Print(c.line)
		if len(recs) != 1 || recs[0].Level != c.level || recs[0].Message != c.msg {
			t.Errorf("%q: got %v, want one %v record %q", c.line, recs, c.level, c.msg)
		}
	}
}

// memberlist's goroutines fail on the closed transport, or on a dial the
// stop cancelled, while the cluster stops; that is said at DEBUG, not as an
// ERROR on every plugin disable. The same failure while running stays an
// error.
func TestMemberlistStopErrorsWhileStopping(t *testing.T) {
	var recs []slog.Record
	var stopping bool
	l := log.New(&mlLogWriter{log: slog.New(recordHandler{&recs}), stopping: func() bool { return stopping }}, "", 0)
	for _, c := range []struct {
		stopping bool
		line     string
		level    slog.Level
	}{
		{false, "[ERR] memberlist: Failed to send ack: write udp [::]:7947->198.51.100.12:7947: use of closed network connection from=198.51.100.12:7947", slog.LevelError},
		{true, "[ERR] memberlist: Failed to send ack: write udp [::]:7947->198.51.100.12:7947: use of closed network connection from=198.51.100.12:7947", slog.LevelDebug},
		{true, "[ERR] memberlist: Failed to send gossip to 198.51.100.11:7947: write udp [::]:7947->198.51.100.11:7947: use of closed network connection", slog.LevelDebug},
		{true, "[ERR] memberlist: Push/Pull with node2 failed: dial tcp 198.51.100.12:7947: operation was canceled", slog.LevelDebug},
		{false, "[ERR] memberlist: Push/Pull with node2 failed: dial tcp 198.51.100.12:7947: operation was canceled", slog.LevelError},
		{true, "[ERR] memberlist: Failed to send gossip to 198.51.100.11:7947: write udp: network is unreachable", slog.LevelError},
	} {
		recs, stopping = nil, c.stopping
		l.Print(c.line)
		if len(recs) != 1 || recs[0].Level != c.level {
			t.Errorf("stopping %v, %q: got %v, want one %v record", c.stopping, c.line, recs, c.level)
		}
	}
}

// A session's connection that ends (this node closed it, or the other end
// went away) fails yamux's loops, which say so at ERR; that is DEBUG, with
// the cluster running or stopping. Other yamux errors keep their level.
func TestSessionEndLines(t *testing.T) {
	var recs []slog.Record
	l := log.New(&mlLogWriter{log: slog.New(recordHandler{&recs}), stopping: func() bool { return false }}, "", 0)
	for line, want := range map[string]slog.Level{
		"[ERR] yamux: Failed to write header: write tcp 198.51.100.11:7947->198.51.100.12:41307: use of closed network connection": slog.LevelDebug,
		"[ERR] yamux: Failed to write body: write tcp 198.51.100.11:7947->198.51.100.12:41307: write: broken pipe":                 slog.LevelDebug,
		"[ERR] yamux: Failed to read header: read tcp 198.51.100.11:7947->198.51.100.12:41307: read: connection reset by peer":     slog.LevelDebug,
		"[ERR] yamux: Invalid protocol version: 7": slog.LevelError,
		"[ERR] memberlist: Failed to send ack: write udp [::]:7947->198.51.100.12:7947: use of closed network connection": slog.LevelError,
	} {
		recs = nil
		l.Print(line)
		if len(recs) != 1 || recs[0].Level != want {
			t.Errorf("%q: got %v, want one %v record", line, recs, want)
		}
	}
}

// memberlist's lines about input it refused become refusals, counted by
// reason and logged at a bounded rate (not one ERROR line per datagram).
func TestMemberlistRefusalLines(t *testing.T) {
	var recs []slog.Record
	var got []Reason
	w := &mlLogWriter{log: slog.New(recordHandler{&recs}), reject: func(r Reason, _ string, _ ...any) { got = append(got, r) }}
	l := log.New(w, "", 0)
	for line, want := range map[string]Reason{
		"[ERR] memberlist: Failed to decode ping request: EOF from=203.0.113.9:7947":        RejectMalformed,
		"[ERR] memberlist: Failed to receive user message: EOF from=203.0.113.9:7947":       RejectMalformed,
		"[ERR] memberlist: Failed to read remote state: EOF from=203.0.113.9:7947":          RejectMalformed,
		"[WARN] memberlist: Got ping for unexpected node 'x' from=203.0.113.9:7947":         RejectMisdirected,
		"[WARN] memberlist: handler queue full, dropping message (8) from=203.0.113.9:7947": RejectQueueFull,
	} {
		recs, got = nil, nil
		l.Print(line)
		if len(recs) != 0 || len(got) != 1 || got[0] != want {
			t.Errorf("%q: logged %v, refusals %v; want the refusal %v alone", line, recs, got, want)
		}
	}
}
