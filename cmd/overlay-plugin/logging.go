package main

import (
	"context"
	"io"
	"log/slog"
)

// newServeLogger is the serve command's logger: text lines, INFO and DEBUG
// on stdout, WARN and ERROR on stderr. dockerd logs a managed plugin's
// stdout at level info and its stderr at level error, so split this way
// each line lands in dockerd's log at the level the plugin gave it, and
// `level=error` there means an error. Outside Docker both streams usually
// go to the same place.
func newServeLogger(stdout, stderr io.Writer, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	return slog.New(newLevelSplit(slog.NewTextHandler(stdout, opts), slog.NewTextHandler(stderr, opts)))
}

// levelSplit hands records below WARN to low and the others to high.
// WithAttrs and WithGroup apply to both, so a derived logger keeps its
// attributes and groups whichever way its records go.
type levelSplit struct{ low, high slog.Handler }

func newLevelSplit(low, high slog.Handler) slog.Handler { return &levelSplit{low: low, high: high} }

func (h *levelSplit) pick(l slog.Level) slog.Handler {
	if l >= slog.LevelWarn {
		return h.high
	}
	return h.low
}

func (h *levelSplit) Enabled(ctx context.Context, l slog.Level) bool {
	return h.pick(l).Enabled(ctx, l)
}

func (h *levelSplit) Handle(ctx context.Context, r slog.Record) error {
	return h.pick(r.Level).Handle(ctx, r)
}

func (h *levelSplit) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return h
	}
	return &levelSplit{low: h.low.WithAttrs(as), high: h.high.WithAttrs(as)}
}

func (h *levelSplit) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &levelSplit{low: h.low.WithGroup(name), high: h.high.WithGroup(name)}
}
