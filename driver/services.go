package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/servicelb"
)

// Service VIPs. Docker allocates a virtual IP to every default-mode swarm
// service and resolves the service's name to it, but balances it only on
// its own overlay. Here each container on the network balances for itself:
// its own namespace (Docker's SandboxKey, given at Join) translates
// connections to a VIP to one of the service's tasks (package servicelb).
// No shared load-balancer address or namespace is needed, the source
// address stays the client's, and nothing outside the container changes.
//
// The services come from Docker (SetServices, from servicewatch); the
// backends are the services' task endpoints that this network's peer db
// holds, at their address of the VIP's family. So a task whose endpoint
// the control plane withdrew is dropped at once, even before Docker's own
// table says so, and one it has not delivered yet waits for it.

// Service is a swarm service with a VIP on a network, as Docker lists it.
type Service struct {
	Name string
	VIP  netip.Addr
	// Ports are Docker's words for its published ports; shown, not used:
	// a VIP forwards every port, as Docker's does.
	Ports []string
	// Endpoints are the endpoint IDs of its tasks on the network.
	Endpoints []string
}

// LoadBalancer programs VIPs into container namespaces (servicelb).
type LoadBalancer interface {
	Apply(nsPath string, svcs []servicelb.Service) error
	Counters(nsPath string) (map[servicelb.Backend]uint64, error)
	Remove(nsPath string) error
}

// ServiceState is one service on a network, for inspection.
type ServiceState struct {
	Name     string         `json:"name"`
	VIP      netip.Addr     `json:"vip"`
	Ports    []string       `json:"ports,omitempty"`
	Tasks    int            `json:"tasks"`
	Backends []BackendState `json:"backends"`
}

// BackendState is a backend in use and the connections this host's
// containers opened to it through the VIP.
type BackendState struct {
	Addr        netip.Addr `json:"addr"`
	Connections uint64     `json:"connections"`
}

// SetServices replaces the network's services and reprograms its
// containers if what they balance changed.
func (d *Driver) SetServices(networkID string, svcs []Service) error {
	seen := map[netip.Addr]string{}
	for _, s := range svcs {
		if !s.VIP.IsValid() || s.VIP.IsUnspecified() {
			return fmt.Errorf("%w: service %q: no VIP", ErrInvalid, s.Name)
		}
		if other, dup := seen[s.VIP]; dup {
			return fmt.Errorf("%w: services %q and %q share VIP %s", ErrInvalid, other, s.Name, s.VIP)
		}
		seen[s.VIP] = s.Name
	}
	n, err := d.mustLockNetwork(networkID)
	if err != nil {
		return err
	}
	defer n.mu.Unlock()
	n.services = make([]Service, len(svcs))
	n.svcEndpoints = map[string]bool{}
	for i, s := range svcs {
		s.Ports, s.Endpoints = slices.Clone(s.Ports), slices.Clone(s.Endpoints)
		n.services[i] = s
		for _, eid := range s.Endpoints {
			n.svcEndpoints[eid] = true
		}
	}
	d.balance(n)
	return nil
}

// ServiceNetworks lists the networks with containers on this host: those
// whose services matter here.
func (d *Driver) ServiceNetworks() []string {
	var out []string
	for _, id := range d.networkIDs() {
		if n := d.lockNetwork(id); n != nil {
			if n.joined > 0 {
				out = append(out, id)
			}
			n.mu.Unlock()
		}
	}
	slices.Sort(out)
	return out
}

// SetServiceWatch registers f, told (with a network lock held: it must not
// block) whenever an endpoint of a network with containers here joins or
// leaves anywhere.
func (d *Driver) SetServiceWatch(f func(networkID string)) { d.svcWatch.Store(&f) }

// endpointChanged tells the watcher, and rebalances if the endpoint is a
// task of one of the network's services. Caller holds n.mu.
func (d *Driver) endpointChanged(n *network, eid string) {
	if n.joined == 0 {
		return
	}
	if f := d.svcWatch.Load(); f != nil {
		(*f)(n.id)
	}
	if n.svcEndpoints[eid] {
		d.balance(n)
	}
}

// backends computes what the network's containers balance. Caller holds n.mu.
func (n *network) backends() []servicelb.Service {
	out := make([]servicelb.Service, 0, len(n.services))
	for _, s := range n.services {
		b := servicelb.Service{Name: s.Name, VIP: s.VIP}
		for _, eid := range s.Endpoints {
			p, ok := n.peers.Get(eid)
			if !ok {
				continue
			}
			for _, ip := range p.IPs {
				if ip.Is4() == s.VIP.Is4() && ip != s.VIP {
					b.Backends = append(b.Backends, ip)
					break
				}
			}
		}
		slices.SortFunc(b.Backends, netip.Addr.Compare)
		b.Backends = slices.Compact(b.Backends)
		out = append(out, b)
	}
	return out
}

// balance programs the network's joined containers with its services,
// those whose last programming differs. A failure leaves the container's
// mark unset, so the next change or refresh retries. Caller holds n.mu.
func (d *Driver) balance(n *network) {
	if d.lb == nil {
		return
	}
	want := n.backends()
	mark := fingerprint(want)
	type job struct {
		ep    *endpoint
		ns    string
		stale bool
		err   error
	}
	var jobs []job
	for _, ep := range n.endpoints {
		if !ep.joined || ep.sandboxKey == "" || ep.balanced == mark {
			continue
		}
		jobs = append(jobs, job{ep: ep, ns: d.sandboxPath(ep.sandboxKey), stale: ep.balanced == balancedByEarlierRun})
	}
	// Each container's table is its own: they are programmed in parallel,
	// most of a change's time being the kernel's work per namespace
	// (the commit's check of the table, conntrack's walk for UDP flows).
	// Only the goroutines touch jobs[i], until Wait.
	var wg sync.WaitGroup
	slots := make(chan struct{}, lbParallel)
	for i := range jobs {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			j := &jobs[i]
			j.err = d.lbNS.set(d.lb, j.ns, n.id, want, j.stale)
		})
	}
	wg.Wait()
	for _, j := range jobs {
		ep, ns, err := j.ep, j.ns, j.err
		switch {
		case err == nil:
			ep.balanced = mark
		case errors.Is(err, os.ErrNotExist):
			d.lbNS.forget(ns)
			d.log.Debug("container namespace gone", "endpoint", ep.id, "sandbox", ns)
		default:
			ep.balanced = ""
			d.log.Warn("program service VIPs", "network", n.id, "endpoint", ep.id, "sandbox", ns, "err", err)
		}
	}
}

// unbalance withdraws the network's services from a container leaving
// it; the container keeps those of its other networks. Caller holds n.mu.
func (d *Driver) unbalance(n *network, ep *endpoint) {
	if d.lb == nil || ep.sandboxKey == "" {
		return
	}
	ns := d.sandboxPath(ep.sandboxKey)
	if err := d.lbNS.set(d.lb, ns, n.id, nil, ep.balanced == balancedByEarlierRun); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Debug("withdraw service VIPs from a leaving container", "network", n.id, "endpoint", ep.id, "err", err)
	}
}

// lbParallel bounds the containers programmed at once.
const lbParallel = 4

// balancedByEarlierRun marks a container adopted at start-up: its table,
// if any, is the previous run's, unknown to this one.
const balancedByEarlierRun = "earlier run"

// fingerprint is a canonical text of what a container balances ("-" for
// nothing, which differs from the unset mark of a fresh container).
func fingerprint(svcs []servicelb.Service) string {
	var b strings.Builder
	b.WriteString("-")
	for _, s := range svcs {
		fmt.Fprintf(&b, "%s=%s%v;", s.Name, s.VIP, s.Backends)
	}
	return b.String()
}

// sandboxPath is where this process finds the namespace Docker names key:
// under SandboxDir when set (the managed plugin mounts Docker's netns
// directory there), else key itself.
func (d *Driver) sandboxPath(key string) string {
	if d.sandboxDir == "" {
		return key
	}
	return filepath.Join(d.sandboxDir, filepath.Base(key))
}

// validSandboxKey checks Docker's SandboxKey: a namespace file's absolute
// path, or empty (no VIPs then).
func validSandboxKey(key string) error {
	if key == "" {
		return nil
	}
	if !filepath.IsAbs(key) || filepath.Clean(key) != key || filepath.Base(key) == "/" {
		return fmt.Errorf("%w: SandboxKey %q is not a clean absolute path", ErrInvalid, key)
	}
	return nil
}

// servicesState reports the network's services with this host's
// connection counts. Caller holds n.mu; reads the containers' counters.
func (d *Driver) servicesState(n *network) []ServiceState {
	st, paths := n.serviceStates(d)
	d.countConnections(st, paths)
	return st
}

// serviceStates copies n's services and their backends, and names the
// namespaces whose load-balancing counters hold their connections (for
// countConnections). Caller holds n.mu.
func (n *network) serviceStates(d *Driver) ([]ServiceState, []string) {
	if len(n.services) == 0 {
		return nil, nil
	}
	var paths []string
	for _, ep := range n.endpoints {
		if ep.joined && ep.sandboxKey != "" {
			paths = append(paths, d.sandboxPath(ep.sandboxKey))
		}
	}
	out := make([]ServiceState, 0, len(n.services))
	for i, b := range n.backends() {
		s := n.services[i]
		st := ServiceState{Name: s.Name, VIP: s.VIP, Ports: slices.Clone(s.Ports), Tasks: len(s.Endpoints), Backends: []BackendState{}}
		for _, a := range b.Backends {
			st.Backends = append(st.Backends, BackendState{Addr: a})
		}
		out = append(out, st)
	}
	return out, paths
}

// countConnections fills in the connections of each backend from the
// load-balancing counters of the namespaces at paths. It needs no network
// lock; a namespace gone meanwhile counts nothing.
func (d *Driver) countConnections(states []ServiceState, paths []string) {
	if d.lb == nil || len(states) == 0 {
		return
	}
	counts := map[servicelb.Backend]uint64{}
	for _, p := range paths {
		c, err := d.lbNS.counters(d.lb, p)
		if err != nil {
			continue
		}
		for k, v := range c {
			counts[k] += v
		}
	}
	for i := range states {
		for j := range states[i].Backends {
			b := &states[i].Backends[j]
			b.Connections = counts[servicelb.Backend{VIP: states[i].VIP, Addr: b.Addr}]
		}
	}
}
