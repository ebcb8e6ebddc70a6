package health

// The path MTU search sends a burst of probes whose sizes step evenly
// from lo to hi, all at once, so it takes one timeout instead of a binary
// search's dozen; a second burst between the largest answered size and
// the smallest lost one narrows it to a few bytes.
const (
	ladderSteps = 16
	// minProbe is the smallest probe size searched: below it no overlay
	// is worth running (IPv4 requires 576).
	minProbe = 256
)

// ladder returns up to ladderSteps sizes from lo to hi inclusive,
// ascending and distinct.
func ladder(lo, hi int) []int {
	if hi < lo {
		return nil
	}
	n := min(ladderSteps, hi-lo+1)
	out := make([]int, 0, n)
	for i := range n {
		s := hi
		if n > 1 {
			s = lo + (hi-lo)*i/(n-1)
		}
		if len(out) == 0 || s > out[len(out)-1] {
			out = append(out, s)
		}
	}
	return out
}

// narrow takes a burst's sizes and which were answered, and returns the
// largest answered size (0 if none) and the range still unknown between it
// and the smallest lost size above it (lo > hi when there is none).
func narrow(sizes []int, answered []bool) (best, lo, hi int) {
	for i, s := range sizes {
		if answered[i] && s > best {
			best = s
		}
	}
	lost := 0
	for i, s := range sizes {
		if !answered[i] && s > best && (lost == 0 || s < lost) {
			lost = s
		}
	}
	if best == 0 || lost == 0 {
		return best, 1, 0
	}
	return best, best + 1, lost - 1
}
