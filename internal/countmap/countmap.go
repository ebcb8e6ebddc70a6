// Package countmap is a map of reference counts that forgets a key as soon
// as its count drops to zero, so "is anything still using K?" is simply
// "is K in the map?" and the map never accumulates dead entries.
package countmap

// Map counts references per key. The zero value is not usable; make one with
// make(countmap.Map[K]). It is not safe for concurrent use: its owner's lock
// guards it.
type Map[K comparable] map[K]int

// Add adjusts the count of k by delta and returns the new count. A count that
// reaches zero (or below, which is a caller bug reported by the negative
// return) removes the key.
func (m Map[K]) Add(k K, delta int) int {
	v := m[k] + delta
	if v <= 0 {
		delete(m, k)
		return v
	}
	m[k] = v
	return v
}
