// Package enginetest is the fake Docker engine of the tests: the swarm,
// networks and services a test sets, answered in-process (as the engine
// interfaces of enginewatch and vni take it, in virtual time if need be)
// or over HTTP on a unix socket (Serve), for the real dockerengine.Client
// and the plugin binary.
package enginetest

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
)

// Engine is one engine's state. Its zero value is not usable: New.
type Engine struct {
	// mu guards everything below. A leaf lock.
	mu sync.Mutex
	// The swarm: this node a manager or not, the managers /info names
	// (host:port), the nodes /nodes lists (a manager's), and /nodes
	// failing on a manager without a leader.
	manager  bool
	managers []string
	// dataPathPort is the swarm's, which /info gives a manager (0: the
	// default, left out of the answer as Docker does).
	dataPathPort uint32
	nodes        []string
	nodesFail    bool
	// networks is /networks; nil answers an error, as an engine that
	// refuses the call. unreachable fails that many calls more as an
	// engine not listening yet does.
	networks      []dockerengine.Network
	unreachable   int
	networksAsked int
	// services are each network's (an absent network is not found), and
	// asked when each network's services were asked.
	services map[string][]dockerengine.Service
	asked    map[string][]time.Time
	// containers are each network's containers on this node (GET
	// /networks/<id>); garbled networks answer JSON that does not parse.
	containers map[string][]dockerengine.Attachment
	garbled    map[string]bool
	// paths are the HTTP paths asked, in order.
	paths []string
}

// New returns an engine of a worker node that knows no network.
func New() *Engine {
	return &Engine{services: map[string][]dockerengine.Service{}, asked: map[string][]time.Time{},
		containers: map[string][]dockerengine.Attachment{}, garbled: map[string]bool{}}
}

// SetSwarm makes this node a manager or not, with the managers /info names
// (host:port) and, on a manager, the node addresses /nodes lists.
func (e *Engine) SetSwarm(manager bool, managers, nodes []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.manager, e.managers, e.nodes = manager, managers, nodes
}

// SetDataPathPort sets the swarm's data-path port /info gives a manager.
func (e *Engine) SetDataPathPort(port uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dataPathPort = port
}

// FailNodes makes a manager's /nodes fail: a swarm without a leader.
func (e *Engine) FailNodes() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nodesFail = true
}

// SetNetworks sets the network list; Networks fails the first unreachable
// calls as an engine not listening does.
func (e *Engine) SetNetworks(unreachable int, nets ...dockerengine.Network) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.networks, e.unreachable = nets, unreachable
}

// SetServices replaces network nid's services (none: it exists, empty).
func (e *Engine) SetServices(nid string, svcs ...dockerengine.Service) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.services[nid] = slices.Clone(svcs)
}

// SetService adds or replaces one service of network nid.
func (e *Engine) SetService(nid string, s dockerengine.Service) {
	e.mu.Lock()
	defer e.mu.Unlock()
	svcs := slices.DeleteFunc(e.services[nid], func(o dockerengine.Service) bool { return o.Name == s.Name })
	e.services[nid] = append(svcs, s)
}

// RemoveService removes the service name of network nid.
func (e *Engine) RemoveService(nid, name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.services[nid] = slices.DeleteFunc(e.services[nid], func(o dockerengine.Service) bool { return o.Name == name })
}

// Asked is when network nid's services were asked.
func (e *Engine) Asked(nid string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.asked[nid])
}

// NetworksAsked is how many times the network list was asked.
func (e *Engine) NetworksAsked() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.networksAsked
}

// Paths are the HTTP paths asked, in order.
func (e *Engine) Paths() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.paths)
}

// SetContainers makes network nid list cs as this node's containers.
func (e *Engine) SetContainers(nid string, cs ...dockerengine.Attachment) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.containers[nid] = slices.Clone(cs)
}

// Garble makes network nid's inspect answer JSON that does not parse.
func (e *Engine) Garble(nid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.garbled[nid] = true
}

// NetworkContainers is dockerengine.Client's, in-process.
func (e *Engine) NetworkContainers(_ context.Context, nid string) ([]dockerengine.Attachment, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cs, ok := e.containers[nid]
	if !ok {
		return nil, dockerengine.ErrNotFound
	}
	return slices.Clone(cs), nil
}

// NetworkServices is dockerengine.Client's, in-process.
func (e *Engine) NetworkServices(_ context.Context, nid string) ([]dockerengine.Service, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.asked[nid] = append(e.asked[nid], time.Now())
	svcs, ok := e.services[nid]
	if !ok {
		return nil, dockerengine.ErrNotFound
	}
	return slices.Clone(svcs), nil
}

// Networks is dockerengine.Client's, in-process.
func (e *Engine) Networks(context.Context) ([]dockerengine.Network, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.networksAsked++
	if e.unreachable > 0 {
		e.unreachable--
		return nil, &url.Error{Op: "Get", URL: "http://docker/networks", Err: errors.New("connection refused")}
	}
	if e.networks == nil {
		return nil, errors.New("docker /networks: HTTP 404")
	}
	return slices.Clone(e.networks), nil
}
