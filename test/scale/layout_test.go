package scale

import (
	"math/rand/v2"
	"slices"
)

// layout places networks on hosts and endpoints on the hosts of their
// network. Endpoint g belongs to network g/perNet; endpoint j of network n
// runs on the network's (j mod hosts)-th host, so every network's
// endpoints are spread evenly over its hosts.
type layout struct {
	nodes, nets, perHost, perNet int
	hostNets                     [][]int // host → its networks, sorted
	netHosts                     [][]int // network → its hosts, sorted
	pos                          []int8  // host*nets + network → index in hostNets[host], or -1
	owner                        []int32 // endpoint → host
	own                          []int   // host → its endpoints
	order                        []int32 // endpoints in rollout order
}

// newLayout gives each host perHost networks, balancing the hosts per
// network, with a fixed pseudo-random choice: hosts sharing one network
// share few others, as in a real cluster (a regular pattern would split
// the hosts into groups with identical sets of networks).
func newLayout(nodes, nets, perHost, endpoints int) *layout {
	l := &layout{nodes: nodes, nets: nets, perHost: perHost, perNet: endpoints / nets,
		hostNets: make([][]int, nodes), netHosts: make([][]int, nets),
		pos: make([]int8, nodes*nets), owner: make([]int32, endpoints), own: make([]int, nodes)}
	rng := rand.New(rand.NewPCG(1, 2))
	for h := range nodes {
		cand := rng.Perm(nets)
		// Least-used networks first; the shuffle breaks ties.
		slices.SortStableFunc(cand, func(a, b int) int { return len(l.netHosts[a]) - len(l.netHosts[b]) })
		l.hostNets[h] = slices.Sorted(slices.Values(cand[:perHost]))
		for _, n := range l.hostNets[h] {
			l.netHosts[n] = append(l.netHosts[n], h)
		}
	}
	for i := range l.pos {
		l.pos[i] = -1
	}
	for h, ns := range l.hostNets {
		for k, n := range ns {
			l.pos[h*nets+n] = int8(k)
		}
	}
	// Rollout order: every host's first endpoint, then every host's second
	// one, …, so a wave of W endpoints is W/hosts per host. A host takes
	// its networks in turn, as a host running tasks of several services
	// does: each of its networks gets a local endpoint, and so a sandbox,
	// in the first wave (a host programs a network's remote endpoints only
	// once it has a sandbox there).
	perHostNet := make([][][]int32, nodes) // host → its k-th network → endpoints
	for h := range perHostNet {
		perHostNet[h] = make([][]int32, perHost)
	}
	for g := range endpoints {
		n, j := g/l.perNet, g%l.perNet
		h := l.netHosts[n][j%len(l.netHosts[n])]
		l.owner[g] = int32(h)
		l.own[h]++
		k := l.pos[h*nets+n]
		perHostNet[h][k] = append(perHostNet[h][k], int32(g))
	}
	perHostEps := make([][]int32, nodes)
	for h, lists := range perHostNet {
		for i := 0; len(perHostEps[h]) < l.own[h]; i++ {
			for _, eps := range lists {
				if i < len(eps) {
					perHostEps[h] = append(perHostEps[h], eps[i])
				}
			}
		}
	}
	for k := 0; len(l.order) < endpoints; k++ {
		for _, eps := range perHostEps {
			if k < len(eps) {
				l.order = append(l.order, eps[k])
			}
		}
	}
	return l
}

func (l *layout) netOf(g int) int { return g / l.perNet }

// slots is the size of the per-(host, endpoint) tables: every host has a
// slot for every endpoint of its networks.
func (l *layout) slots() int { return l.nodes * l.perHost * l.perNet }

// slot is (host, endpoint)'s index in those tables, or -1 if the endpoint's
// network is not the host's.
func (l *layout) slot(h, g int) int {
	k := l.pos[h*l.nets+l.netOf(g)]
	if k < 0 {
		return -1
	}
	return (h*l.perHost+int(k))*l.perNet + g%l.perNet
}

// peers is how many hosts other than its owner must program endpoint g.
func (l *layout) peers(g int) int { return len(l.netHosts[l.netOf(g)]) - 1 }

// remote is how many remote endpoints host h must program.
func (l *layout) remote(h int) int { return l.perHost*l.perNet - l.own[h] }
