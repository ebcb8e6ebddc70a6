package scale

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

// Addressing. Node i gossips at 192.168.0.1+i:7947 and uses that address
// as its VTEP; endpoint g (global index, see layout) has 10.0.0.0+2+g in
// its network's 10.0.0.0/8 pool (every network has that pool; addresses
// are unique across networks nonetheless, so an IP names its endpoint)
// and Docker's MAC for it, 02:42:<IPv4>.
const (
	gossipPort  = cluster.DefaultBindPort
	vxlanPort   = 4789
	vtepBase    = 0xC0A80001 // 192.168.0.1
	epBase      = 0x0A000002 // 10.0.0.2
	poolCIDR    = "10.0.0.0/8"
	gatewayCIDR = "10.0.0.1/8"
	// genericOptionsKey is where Docker puts the options AllocateNetwork
	// returned when it calls CreateNetwork on every node.
	genericOptionsKey = "com.docker.network.generic"
)

func u32Addr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func nodeIP(i int) netip.Addr { return u32Addr(vtepBase + uint32(i)) }
func epIP(g int) netip.Addr   { return u32Addr(epBase + uint32(g)) }
func nodeName(i int) string   { return fmt.Sprintf("host%04d", i) }
func netID(n int) string      { return hexID("network", n) }
func epMAC(g int) hwaddr.MAC {
	ip := epIP(g).As4()
	return hwaddr.MAC{0x02, 0x42, ip[0], ip[1], ip[2], ip[3]}
}
func hexID(kind string, i int) string {
	// Docker's ids are 64 random hex digits; a hash gives the same entropy
	// (which matters to the codec's packing and memberlist's compression).
	s := sha256.Sum256(fmt.Appendf(nil, "%s-%d", kind, i))
	return hex.EncodeToString(s[:])
}

// tracker records, for every (host, endpoint of one of its networks),
// when the endpoint's neighbour entry first appeared in that host's
// sandbox of the network, and for every endpoint when the last of its
// network's other hosts programmed it. All times are nanoseconds since t0
// (never 0 once set), virtual in the synctest bubble.
type tracker struct {
	t0       time.Time
	l        *layout
	nets     map[string]int // network ID → index; read-only
	joinAt   []atomic.Int64 // by endpoint: just before its Join
	progAt   []atomic.Int64 // by layout slot: first SetNeighbor
	count    []atomic.Int32 // by endpoint: other hosts that programmed it
	doneAt   []atomic.Int64 // by endpoint: when count reached its peers
	complete atomic.Int64   // endpoints programmed on every host of their network

	// Calls the scenario should not cause (entries for IPs that are no
	// endpoint's, for a host's own endpoint, or in the sandbox of another
	// network), and neighbour deletions (only if a remote endpoint was
	// withdrawn, e.g. its owner purged).
	foreignIP, ownIP, wrongNet, deletes atomic.Int64
}

func newTracker(l *layout) *tracker {
	e := len(l.owner)
	tr := &tracker{
		t0: time.Now(), l: l, nets: map[string]int{},
		joinAt: make([]atomic.Int64, e),
		progAt: make([]atomic.Int64, l.slots()),
		count:  make([]atomic.Int32, e),
		doneAt: make([]atomic.Int64, e),
	}
	for n := range l.nets {
		tr.nets[netID(n)] = n
	}
	return tr
}

func (tr *tracker) now() int64 { return int64(time.Since(tr.t0)) + 1 }

func (tr *tracker) epIndex(ip netip.Addr) int {
	if !ip.Is4() {
		return -1
	}
	b := ip.As4()
	v := binary.BigEndian.Uint32(b[:]) - epBase
	if v >= uint32(len(tr.l.owner)) {
		return -1
	}
	return int(v)
}

// programmed notes that node programmed the neighbour entry for ip in
// sandbox sb.
func (tr *tracker) programmed(node int, sb string, ip netip.Addr) {
	g := tr.epIndex(ip)
	switch {
	case g < 0:
		tr.foreignIP.Add(1)
		return
	case int(tr.l.owner[g]) == node:
		tr.ownIP.Add(1)
		return
	}
	n, ok := tr.nets[sb]
	slot := tr.l.slot(node, g)
	if !ok || n != tr.l.netOf(g) || slot < 0 {
		tr.wrongNet.Add(1)
		return
	}
	now := tr.now()
	if !tr.progAt[slot].CompareAndSwap(0, now) {
		return // replaced an entry it had already
	}
	if int(tr.count[g].Add(1)) == tr.l.peers(g) {
		tr.doneAt[g].Store(now)
		tr.complete.Add(1)
	}
}

// kernel operations whose cost is accounted.
const (
	opCreateSandbox = iota
	opAddVeth
	opSetNeighbor
	opAddFDB
	opDeleteNeighbor
	opDeleteFDB
	numOps
)

var opNames = [numOps]string{"CreateSandbox", "AddVeth", "SetNeighbor", "AddFDB", "DeleteNeighbor", "DeleteFDB"}

// opCost accumulates calls and real time spent in kernel operations (all
// nodes); real, since in a bubble virtual time does not move during a call.
type opCost struct{ calls, ns [numOps]atomic.Int64 }

func (c *opCost) add(op int, start time.Duration) {
	c.calls[op].Add(1)
	c.ns[op].Add(int64(wallNow() - start))
}

// stampKernel is the fake kernel with a thin layer that timestamps every
// neighbour entry as it is set (after the fake holds it) and times the
// mutating calls. Exact: no polling.
type stampKernel struct {
	*fakekernel.Kernel
	node int
	tr   *tracker
	cost *opCost
}

func (k *stampKernel) CreateSandbox(s kernel.SandboxSpec) error {
	defer k.cost.add(opCreateSandbox, wallNow())
	return k.Kernel.CreateSandbox(s)
}

func (k *stampKernel) AddVeth(sb string, v kernel.Veth) error {
	defer k.cost.add(opAddVeth, wallNow())
	return k.Kernel.AddVeth(sb, v)
}

// Program applies one op at a time, so that each is timed and each
// neighbour stamped as it is set.
func (k *stampKernel) Program(sb string, ops []kernel.EntryOp) []error {
	var errs []error
	for i := range ops {
		op := ops[i : i+1]
		start := wallNow()
		err := errors.Join(k.Kernel.Program(sb, op)...)
		switch op[0].Kind {
		case kernel.OpSetNeighbor:
			k.cost.add(opSetNeighbor, start)
			if err == nil {
				k.tr.programmed(k.node, sb, op[0].Neighbor.IP)
			}
		case kernel.OpDeleteNeighbor:
			k.cost.add(opDeleteNeighbor, start)
			k.tr.deletes.Add(1)
		case kernel.OpAddFDB:
			k.cost.add(opAddFDB, start)
		case kernel.OpDeleteFDB:
			k.cost.add(opDeleteFDB, start)
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(ops))
			}
			errs[i] = err
		}
	}
	return errs
}

var _ kernel.Kernel = (*stampKernel)(nil)

// node is one simulated host: a plugin instance's driver and gossip on
// their own fake kernel and in-memory transport.
type node struct {
	i    int
	ip   netip.Addr
	fake *fakekernel.Kernel
	k    *stampKernel
	d    *driver.Driver
	c    *cluster.Cluster
	tr   *memnet.Transport
	db   *bbolt.DB

	resyncStop, resyncDone chan struct{}
	closeOnce              sync.Once
}

// startNode builds node i's driver (with its own VNI database, as a real
// plugin has) and its cluster, joining seeds, and connects them.
func startNode(dir string, net *memnet.Network, p params, tr *tracker, cost *opCost, log *slog.Logger, i int, seeds []string) (*node, error) {
	n := &node{i: i, ip: nodeIP(i), fake: fakekernel.New()}
	n.k = &stampKernel{Kernel: n.fake, node: i, tr: tr, cost: cost}
	db, err := bbolt.Open(filepath.Join(dir, fmt.Sprintf("%s.db", nodeName(i))), 0o600, nil)
	if err != nil {
		return nil, err
	}
	n.db = db
	alloc, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		return n, err
	}
	n.d, err = driver.New(driver.Config{
		Kernel:        n.k,
		Underlay:      drivertest.Underlay{Addr: n.ip},
		VNIs:          alloc,
		AdvertiseAddr: n.ip,
		VXLANPort:     vxlanPort,
		Logger:        log,
	})
	if err != nil {
		return n, err
	}
	n.tr, err = net.NewTransport(netip.AddrPortFrom(n.ip, gossipPort))
	if err != nil {
		return n, err
	}
	var key []byte
	if p.Encrypt {
		key = make([]byte, 32)
		copy(key, "scale-simulation-shared-key-0001")
	}
	n.c, err = cluster.New(cluster.Config{
		NodeName:         nodeName(i),
		BindPort:         gossipPort,
		AdvertiseAddr:    n.ip,
		Join:             seeds,
		SecretKey:        key,
		Transport:        n.tr,
		MemberlistConfig: p.tune,
		Sink:             n.d,
		Logger:           log,
	})
	if err != nil {
		n.tr.Shutdown()
		return n, err
	}
	n.d.SetControlPlane(n.c)
	return n, nil
}

// resyncLoop runs the driver's periodic kernel resync, as serve does,
// first after offset (hosts are not in step), then every period.
func (n *node) resyncLoop(offset, period time.Duration, counts *resyncCounts) {
	n.resyncStop = make(chan struct{})
	n.resyncDone = make(chan struct{})
	go func() {
		defer close(n.resyncDone)
		t := time.NewTimer(offset)
		defer t.Stop()
		for {
			select {
			case <-n.resyncStop:
				return
			case <-t.C:
			}
			a, r, err := n.d.Resync()
			counts.runs.Add(1)
			counts.added.Add(int64(a))
			counts.removed.Add(int64(r))
			if err != nil {
				counts.errs.Add(1)
			}
			t.Reset(period)
		}
	}()
}

type resyncCounts struct{ runs, added, removed, errs atomic.Int64 }

// stopResync ends the resync loop, if one runs. Idempotent; not
// concurrent with itself.
func (n *node) stopResync() {
	if n.resyncStop != nil {
		close(n.resyncStop)
		<-n.resyncDone
		n.resyncStop = nil
	}
}

// close stops the node; a partly built node is closed as far as it got.
// Idempotent.
func (n *node) close() {
	n.closeOnce.Do(func() {
		n.stopResync()
		if n.c != nil {
			n.c.Close()
		}
		if n.d != nil {
			n.d.Close()
		}
		if n.db != nil {
			n.db.Close()
		}
	})
}

// tune applies the run's memberlist timers on top of the cluster's
// configuration (memberlist.DefaultLANConfig).
func (p params) tune(c *memberlist.Config) {
	if p.GossipInterval > 0 {
		c.GossipInterval = p.GossipInterval
	}
	if p.PushPullInterval > 0 {
		c.PushPullInterval = p.PushPullInterval
	}
	if p.ProbeInterval > 0 {
		c.ProbeInterval = p.ProbeInterval
	}
	if p.SuspicionMult > 0 {
		c.SuspicionMult = p.SuspicionMult
	}
	c.EnableCompression = p.Compression
}
