//go:build !race

package cluster

// raceBuild: the race detector is on (tests that measure CPU skip).
const raceBuild = false
