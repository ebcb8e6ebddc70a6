package scale

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// logCounter is a slog.Handler that drops everything but counts the
// warnings and errors by message, and the info lines that say a host was
// suspected or declared dead, so the run's logs cost little yet a dropped
// message, a rejected record or a false death shows up in the results.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
	live   liveness
}

// liveness counts memberlist's failure detector at work. No host fails in
// any scenario: every one of these is a false alarm.
type liveness struct {
	Suspected        int `json:"suspected"`        // "Suspect <host> has failed, no acks received"
	DeclaredDead     int `json:"declaredDead"`     // "Marking <host> as failed, suspect timeout reached"
	MemberGone       int `json:"memberGone"`       // the cluster's NotifyLeave: "member gone"
	Refuted          int `json:"refuted"`          // a host refuting a suspicion of itself
	HandlerQueueFull int `json:"handlerQueueFull"` // memberlist dropped an inbound message
}

func newLogCounter() *logCounter { return &logCounter{counts: map[string]int{}} }

func (w *logCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

// addrRE matches the addresses memberlist puts in its messages, so that one
// kind of warning from 100 hosts counts as one line.
var addrRE = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+(:\d+)?|host\d+`)

func (w *logCounter) Handle(_ context.Context, r slog.Record) error {
	m := r.Message
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case strings.HasPrefix(m, "Suspect "):
		w.live.Suspected++
	case strings.HasPrefix(m, "Marking ") && strings.Contains(m, "as failed"):
		w.live.DeclaredDead++
	case strings.HasPrefix(m, "member gone"):
		w.live.MemberGone++
	case strings.HasPrefix(m, "Refuting a suspect"):
		w.live.Refuted++
	case strings.Contains(m, "handler queue full"):
		w.live.HandlerQueueFull++
	}
	if r.Level < slog.LevelWarn {
		return nil
	}
	msg := addrRE.ReplaceAllString(m, "<addr>")
	if len(msg) > 100 {
		msg = msg[:100] + "…"
	}
	w.counts[r.Level.String()+" "+msg]++
	return nil
}

func (w *logCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *logCounter) WithGroup(string) slog.Handler      { return w }

// snapshot returns the liveness counts and "count× message" lines of the
// warnings, most frequent first.
func (w *logCounter) snapshot() (liveness, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range w.counts {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || all[i].v == all[j].v && all[i].k < all[j].k })
	out := make([]string, len(all))
	for i, e := range all {
		out[i] = fmt.Sprintf("%d× %s", e.v, e.k)
	}
	return w.live, out
}
