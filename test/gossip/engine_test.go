package gossip

import (
	"strings"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// setService makes e list network nid's service name with vip and the
// given tasks, as Docker's gossip would list them there (or removes it
// when vip is empty).
func setService(e *enginetest.Engine, nid, name, vip string, tasks ...*testbed.Endpoint) {
	if vip == "" {
		e.RemoveService(nid, name)
		return
	}
	s := dockerengine.Service{Name: name, VIP: vip, Ports: []string{}, Tasks: []dockerengine.Task{}}
	for i, ep := range tasks {
		s.Tasks = append(s.Tasks, dockerengine.Task{Name: name + "." + strings.Repeat("x", i+1), EndpointID: ep.ID,
			EndpointIP: ep.Addrs[0].Addr().String()})
	}
	e.SetService(nid, s)
}
