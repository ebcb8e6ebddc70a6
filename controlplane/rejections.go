package controlplane

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/overlay-plugin/overlay-plugin/cluster"
)

// The check reports gossip refused lately, not since start: the counters
// are sampled every rejectionSample and the last rejectionWindow's growth
// is what counts.
const (
	rejectionSample = 10 * time.Second
	rejectionWindow = time.Minute
)

// rejections keeps the last window's samples of the refusal counters,
// oldest first: a slice replaced whole by its one writer (run), never
// changed in place, so readers share it without a lock.
type rejections struct {
	samples atomic.Pointer[[]map[string]uint64]
}

// counts are a Stats' refusal counters by reason (check's names).
func counts(s cluster.Stats) map[string]uint64 {
	return map[string]uint64{
		"foreign_owner": s.RejectedForeignOwner, "vtep": s.RejectedVTEP, "not_member": s.RejectedNotMember,
		"decrypt": s.RejectedDecrypt, "plain": s.RejectedPlain, "compressed": s.RejectedCompressed,
		"unknown_type": s.RejectedUnknownType, "misdirected": s.RejectedMisdirected, "queue_full": s.RejectedQueueFull,
		"wire_version": s.RejectedWireVersion, "decode": s.DecodeErrors,
		"stream_idle": s.RejectedStreamIdle, "stream_limit": s.RejectedStreamLimit,
	}
}

func (r *rejections) run(ctx context.Context, c *cluster.Cluster) {
	t := time.NewTicker(rejectionSample)
	defer t.Stop()
	for {
		r.add(counts(c.Stats()))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *rejections) add(s map[string]uint64) {
	var old []map[string]uint64
	if p := r.samples.Load(); p != nil {
		old = *p
	}
	keep := int(rejectionWindow/rejectionSample) + 1
	next := append(old[max(0, len(old)+1-keep):len(old):len(old)], s)
	r.samples.Store(&next)
}

// recent is each reason's growth over the window (now included), the
// reasons that grew only.
func (r *rejections) recent(now map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	p := r.samples.Load()
	if p == nil || len(*p) == 0 {
		return out
	}
	first := (*p)[0]
	for reason, n := range now {
		if n > first[reason] {
			out[reason] = n - first[reason]
		}
	}
	return out
}
