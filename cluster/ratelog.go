package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Refusals are logged at a bounded rate: anyone who reaches the gossip
// port can send a refusal's worth of garbage per datagram. A log line that
// carries reasonKey is rate-limited per reason: the first goes out, then
// at most one per rejectLogEvery, saying how many were left out since the
// previous one ("suppressed"); the counters (Stats) count them all.
const (
	reasonKey      = "reason"
	rejectLogEvery = 10 * time.Second
)

// logLimiter keeps, per reason, when its last line went out and how many
// were left out since.
type logLimiter struct {
	clock func() time.Time
	every time.Duration
	// mu guards reasons. A leaf lock, taken under Cluster.mu (the state
	// logs with it held); no log line is written while it is held.
	mu      lockrank.Mutex[lockrank.RateLog]
	reasons map[string]*limitState
}

type limitState struct {
	last    time.Time // when the reason's last line went out
	dropped uint64    // its lines left out since
	// level and h are those of the last line left out: a summary of the
	// left-out lines (flush) goes where they would have gone.
	level slog.Level
	h     slog.Handler
}

func newLogLimiter(clock func() time.Time, every time.Duration) *logLimiter {
	return &logLimiter{clock: clock, every: every, reasons: map[string]*limitState{}}
}

// admit decides whether a line of reason goes out, and says how many of
// its lines were left out before it.
func (l *logLimiter) admit(reason string, level slog.Level, h slog.Handler) (bool, uint64) {
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.reasons[reason]
	switch {
	case st == nil:
		l.reasons[reason] = &limitState{last: now}
		return true, 0
	case now.Sub(st.last) >= l.every:
		n := st.dropped
		st.last, st.dropped, st.h = now, 0, nil
		return true, n
	}
	st.dropped++
	st.level, st.h = level, h
	return false, 0
}

// flush writes, for each reason whose lines were left out and whose last
// line is an interval old, how many were: a burst is accounted for
// without waiting for the next refusal.
func (l *logLimiter) flush() {
	type summary struct {
		reason string
		st     limitState
	}
	now := l.clock()
	var out []summary
	l.mu.Lock()
	for reason, st := range l.reasons {
		if st.dropped > 0 && now.Sub(st.last) >= l.every {
			out = append(out, summary{reason, *st})
			st.last, st.dropped, st.h = now, 0, nil
		}
	}
	l.mu.Unlock()
	for _, s := range out {
		r := slog.NewRecord(now, s.st.level, "gossip refusals left out of the log", 0)
		r.AddAttrs(slog.String(reasonKey, s.reason), slog.Uint64("suppressed", s.st.dropped))
		_ = s.st.h.Handle(context.Background(), r)
	}
}

// rateHandler passes lines through a logLimiter.
type rateHandler struct {
	slog.Handler
	lim *logLimiter
}

func (h rateHandler) Handle(ctx context.Context, r slog.Record) error {
	reason := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == reasonKey {
			reason = a.Value.String()
			return false
		}
		return true
	})
	if reason == "" {
		return h.Handler.Handle(ctx, r)
	}
	ok, n := h.lim.admit(reason, r.Level, h.Handler)
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Uint64("suppressed", n))
	}
	return h.Handler.Handle(ctx, r)
}

func (h rateHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return rateHandler{h.Handler.WithAttrs(as), h.lim}
}

func (h rateHandler) WithGroup(name string) slog.Handler {
	return rateHandler{h.Handler.WithGroup(name), h.lim}
}
