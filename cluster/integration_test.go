package cluster

import "github.com/overlay-plugin/overlay-plugin/driver"

// The driver and the cluster plug into each other. (Many nodes in one
// process are the scale simulation's, test/scale.)
var (
	_ driver.ControlPlane = (*Cluster)(nil)
	_ Sink                = (*driver.Driver)(nil)
)
