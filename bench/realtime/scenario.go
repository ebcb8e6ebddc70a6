// Package realtime is a real-time scale benchmark of endpoint dissemination
// over real sockets on loopback. It runs one scenario against two systems:
// this plugin's control plane (package cluster) and Docker's NetworkDB, one
// instance per simulated host, each host on its own loopback address, and
// measures how long every endpoint takes to reach every other host.
package realtime

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Params are one run's parameters.
type Params struct {
	Hosts        int           `json:"hosts"`
	Endpoints    int           `json:"endpoints"` // in total; every host publishes Endpoints/Hosts
	Waves        int           `json:"waves"`
	WaveInterval time.Duration `json:"waveIntervalNs"`
	Timeout      time.Duration `json:"timeoutNs"` // per phase: membership, network, convergence
	Seeds        int           `json:"seeds"`     // hosts every host is told to join
	PortA        int           `json:"portPlugin"`
	PortB        int           `json:"portNetworkDB"`
}

// DefaultParams is the full scenario at 100 hosts.
func DefaultParams() Params {
	return Params{Hosts: 100, Endpoints: 10000, Waves: 10, WaveInterval: 2 * time.Second,
		Timeout: 180 * time.Second, Seeds: 3, PortA: 17947, PortB: 17946}
}

func (p Params) perHost() int { return p.Endpoints / p.Hosts }

func (p Params) check() error {
	switch {
	case p.Hosts < 2 || p.Hosts > 254:
		return errors.New("hosts must be 2..254 (one loopback address each)")
	case p.Endpoints%p.Hosts != 0:
		return fmt.Errorf("%d endpoints do not split evenly over %d hosts", p.Endpoints, p.Hosts)
	case p.Waves < 1 || p.perHost()%p.Waves != 0:
		return fmt.Errorf("%d endpoints per host do not split into %d equal waves", p.perHost(), p.Waves)
	case p.Endpoints > 1<<24-2:
		return errors.New("too many endpoints for the 10.0.0.0/8 addresses")
	}
	return nil
}

// hostAddr is host i's address for system net (1: plugin, 2: NetworkDB).
// Everything stays in 127.0.0.0/8, which Linux routes to lo as a whole.
func hostAddr(net byte, i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, net, byte(i + 1)}) }

func hostName(i int) string { return fmt.Sprintf("host%03d", i) }

// The network both systems carry; a Docker-style 25-character id.
const networkID = "benchnetwork0000000000001"

// endpoints holds the ids and addresses of every endpoint. Endpoint g
// belongs to host g / perHost.
type endpoints struct {
	perHost int
	ids     []string
	byID    map[string]int
}

func newEndpoints(p Params) *endpoints {
	e := &endpoints{perHost: p.perHost(), ids: make([]string, p.Endpoints), byID: make(map[string]int, p.Endpoints)}
	for g := range p.Endpoints {
		// Docker's ids are 64 random hex digits; a hash gives the same
		// entropy, which matters to compression.
		s := sha256.Sum256(fmt.Appendf(nil, "endpoint-%d", g))
		e.ids[g] = hex.EncodeToString(s[:])
		e.byID[e.ids[g]] = g
	}
	return e
}

func (e *endpoints) owner(g int) int { return g / e.perHost }

func epIP(g int) netip.Addr {
	v := uint32(10)<<24 + uint32(g) + 2
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func epMAC(g int) [6]byte {
	ip := epIP(g).As4()
	return [6]byte{0x02, 0x42, ip[0], ip[1], ip[2], ip[3]}
}

// tracker records when each endpoint was published and when each host
// first learned it, in ns since its origin (0: not yet).
type tracker struct {
	t0      time.Time
	hosts   int
	eps     *endpoints
	pubAt   []atomic.Int64 // per endpoint
	seenAt  []atomic.Int64 // per host*E + endpoint
	state   []atomic.Uint32
	count   []atomic.Int32 // per endpoint: hosts that saw it
	doneAt  []atomic.Int64 // per endpoint: when the last other host saw it
	done    atomic.Int64   // endpoints seen on every other host
	pairs   atomic.Int64   // (host, endpoint) pairs seen
	foreign atomic.Int64   // events for unknown or own endpoints
}

// Per (host, endpoint) state as the host's events left it.
const (
	stAbsent uint32 = iota
	stRight         // present with the right value
	stWrong         // present with a wrong value
)

func newTracker(hosts int, eps *endpoints) *tracker {
	n := len(eps.ids)
	return &tracker{t0: time.Now(), hosts: hosts, eps: eps,
		pubAt: make([]atomic.Int64, n), seenAt: make([]atomic.Int64, hosts*n), state: make([]atomic.Uint32, hosts*n),
		count: make([]atomic.Int32, n), doneAt: make([]atomic.Int64, n)}
}

func (t *tracker) now() int64 { return int64(time.Since(t.t0)) + 1 }

// set is a host's event for endpoint id: present with a right or wrong
// value, or gone. Each host's events come from one goroutine.
func (t *tracker) set(host int, id string, st uint32) {
	g, ok := t.eps.byID[id]
	if !ok || t.eps.owner(g) == host {
		t.foreign.Add(1)
		return
	}
	i := host*len(t.eps.ids) + g
	t.state[i].Store(st)
	if st == stAbsent || !t.seenAt[i].CompareAndSwap(0, t.now()) {
		return
	}
	t.pairs.Add(1)
	if int(t.count[g].Add(1)) == t.hosts-1 {
		t.doneAt[g].Store(t.now())
		t.done.Add(1)
	}
}

// verify checks that host holds exactly the other hosts' endpoints, each
// with the right value.
func (t *tracker) verify(host int) error {
	n := len(t.eps.ids)
	var missing, wrong, extra int
	for g := range n {
		st := t.state[host*n+g].Load()
		switch {
		case t.eps.owner(g) == host:
			if st != stAbsent {
				extra++
			}
		case st == stAbsent:
			missing++
		case st == stWrong:
			wrong++
		}
	}
	if missing+wrong+extra > 0 {
		return fmt.Errorf("%s: %d endpoints missing, %d with a wrong value, %d own endpoints delivered", hostName(host), missing, wrong, extra)
	}
	return nil
}

// system is one control plane under test, all its hosts in this process.
type system interface {
	name() string
	// start creates the hosts, waits until each sees every host alive,
	// and joins the network everywhere. Events go to tr.set.
	start(p Params, tr *tracker) (membership, network time.Duration, err error)
	publish(host, g int) error
	// aliveViews is the sum over hosts of the members each sees alive.
	aliveViews() int
	// verifyTable checks the system's own table on host (the tracker
	// checks what its events delivered).
	verifyTable(host int) error
	close()
	// settle bounds how long the goroutines of closed hosts may take to
	// return: the longest wait the system's own code keeps after close.
	settle() time.Duration
}

// waitFor polls f every interval until it holds or timeout passes.
func waitFor(timeout, interval time.Duration, f func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}

// parallel runs f(i) for i in [0, n) on all cores and returns the first error.
func parallel(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  atomic.Int64
	)
	for range runtime.GOMAXPROCS(0) * 4 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// all runs f(i) for i in [0, n) at once: for closing, where every host
// mostly waits (a graceful leave), and closing them one batch after the
// other makes the rest react to each departure.
func all(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}
