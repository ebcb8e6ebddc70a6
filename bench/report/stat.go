// Package report holds what every make bench figure writes the same way:
// min/median/max statistics, the machine's description with its load, and
// <figure>.{json,md,png} with a bar plot of medians and min-max bars.
package report

import (
	"fmt"
	"slices"
)

// Stat is min, median and max of a sample.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// NewStat summarises v (the zero Stat when v is empty).
func NewStat(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Min: s[0], Median: m, Max: s[len(s)-1], N: len(s)}
}

func (s Stat) String() string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s / %s", num(s.Min), num(s.Median), num(s.Max))
}

func num(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
