package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/hashicorp/memberlist"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// Sink receives remote endpoint changes. Implemented by *driver.Driver.
// Called from the cluster's delivery goroutine with NO cluster lock held.
// Returns driver.ErrNotFound-wrapped errors for networks that do not exist
// locally; any error is treated as "not applicable now" (logged at debug),
// not fatal.
type Sink interface {
	AddPeer(networkID string, p peerdb.Peer) error
	DeletePeer(networkID, endpointID string) error
}

// BatchSink is a Sink that also takes a burst of one network's additions
// at once (the driver programs them as one kernel batch).
type BatchSink interface {
	Sink
	AddPeers(networkID string, peers []peerdb.Peer) error
}

// Config builds a Cluster.
type Config struct {
	NodeName      string     // unique per node; memberlist node name
	BindAddr      string     // gossip bind address (default "0.0.0.0")
	BindPort      int        // gossip port; 0 picks a free one (tests)
	AdvertiseAddr netip.Addr // this node's address for gossip AND its VTEP
	Join          []string   // seeds host[:port]; port defaults to BindPort
	// SecretKey is nil, or 32 bytes: gossip is then encrypted and
	// authenticated (AES-256-GCM), and plaintext gossip is refused. It is
	// the primary key, which this node sends with; AcceptKeys are the
	// other keys of a rotation, which it accepts too (SetKeys changes
	// them). KeyIDs name the cluster secrets these keys come from, the
	// primary's first: every member is told them (Settings), and Members
	// shows each member's.
	SecretKey  []byte
	AcceptKeys [][]byte
	KeyIDs     []string
	// MemberKeyIDs, if set, receives the key ids a member said it holds,
	// by its VTEP, when it says them: from the goroutine that calls the
	// Sink, the latest of each member's, never under a lock of this
	// package.
	MemberKeyIDs func(vtep netip.Addr, ids []string)
	DeadGrace    time.Duration // how long a gone node's records survive (default 30s)
	// RestartGrace replaces DeadGrace for a node that announced, as it
	// was stopped on purpose (Close), that it is restarting: its records,
	// and the node data (keys) of its VTEP, survive that long (default 10m;
	// never less than DeadGrace). restart.go.
	RestartGrace   time.Duration
	TombstoneTTL   time.Duration // how long delete tombstones are kept (default 10m)
	RejoinInterval time.Duration // how often to re-join known addresses that are not alive (default 10s)
	SyncInterval   time.Duration // how often each network's digest goes to one of its members (default 1s)
	// Transport is nil for memberlist's UDP+TCP transport; tests pass
	// in-memory transports (memberlist.MockNetwork, or cluster/memnet).
	Transport memberlist.Transport
	// MemberlistConfig, if set, may adjust memberlist's configuration
	// (DefaultLANConfig with this package's settings applied) before it is
	// used; Name, Delegate and Events are restored afterwards, and an
	// Alive delegate it sets is consulted after this package's own.
	MemberlistConfig func(*memberlist.Config)
	Sink             Sink
	// NodeData receives the node data (SetNodeData) of other nodes, keyed
	// by their VTEP, and nil when a node is gone past the grace period.
	// Called from the delivery goroutine with no cluster lock held.
	NodeData func(vtep netip.Addr, data []byte)
	// MemberVTEPs receives the live members' VTEPs (this node's excepted)
	// whenever they change: a member's before any of its records reaches
	// the Sink, from the delivery goroutine with no cluster lock held.
	MemberVTEPs func(vteps []netip.Addr)
	// Settings are this node's, told to every member (settings.go); zero:
	// none. Without a VXLANPort they are told only once SettleSettings
	// gives one, and nobody is refused meanwhile.
	Settings Settings
	// AwaitOwn: the owner republishes the endpoints it still holds after
	// New (a restarted plugin's driver), and calls OwnSettled when done;
	// records under this node's name that it does not hold are retracted
	// only then, not while the republish is under way.
	AwaitOwn bool
	Logger   *slog.Logger
	Clock    func() time.Time // nil: time.Now

	// wireRange, for tests, is the range of wire versions this node
	// speaks; zero: wireMin..wireMax. A test node may speak fewer (an
	// older release) or others (a future one that shares none with us).
	wireRange [2]byte
}

// Defaults.
const (
	// DefaultBindPort is the suggested gossip port (New does not apply it:
	// BindPort 0 picks a free port). Docker's own NetworkDB uses 7946 on
	// the same host, so the plugin must not.
	DefaultBindPort       = 7947
	DefaultDeadGrace      = 30 * time.Second
	DefaultRestartGrace   = 10 * time.Minute
	DefaultTombstoneTTL   = 10 * time.Minute
	DefaultRejoinInterval = 10 * time.Second
	DefaultSyncInterval   = time.Second
	// maxBroadcastQueue bounds queued broadcasts; anti-entropy repairs what
	// pruning drops.
	maxBroadcastQueue = 8192
	// metaPushFanout is how many members get each node meta change by
	// push/pull besides the broadcast; they gossip it on.
	metaPushFanout = 3
)

// Cluster is one node of the gossip control plane.
type Cluster struct {
	name     string
	log      *slog.Logger
	clock    func() time.Time
	sink     Sink
	port     int           // gossip port, for hints and seeds without one
	selfAddr string        // own gossip host:port
	leaveTO  time.Duration // bound on the graceful leave in Close
	metaTO   time.Duration // how long metaLoop waits for a meta broadcast, and between retries
	sweepInt time.Duration
	rejoin   time.Duration
	syncInt  time.Duration
	// probeInt is memberlist's ProbeInterval: how often gone members are
	// pinged (reconnectLoop).
	probeInt time.Duration
	// meta is the memberlist node meta: VTEP, start epoch and node data.
	// Atomic: memberlist reads it under its own locks.
	meta atomic.Pointer[[]byte]
	adv  netip.Addr
	// settings are this node's, told to the members (settings.go);
	// guarded by mu: a node that joins before it knows its VXLAN port
	// settles them later (SettleSettings).
	settings Settings
	// keyIDs are the ids of the secrets of this node's keyring, primary
	// first, told to the members with the settings; guarded by mu.
	keyIDs   []string
	epoch    uint64
	nodeData func(netip.Addr, []byte)
	// memberKeyIDs is Config.MemberKeyIDs; set once in New. keyIDsDue
	// are the members whose key ids it is due (settings.go); guarded by
	// mu.
	memberKeyIDs func(netip.Addr, []string)
	keyIDsDue    map[string]bool
	// memberVTEPs is Config.MemberVTEPs; set once in New.
	memberVTEPs func([]netip.Addr)
	ml          *memberlist.Memberlist // set in New before any goroutine of ours starts
	queue       *memberlist.TransmitLimitedQueue

	// mu guards st (records, members, pending records, the dirty set and
	// this node's version clock), cands, comebacks, the outboxes and
	// their counters, and syncNow. Lock order: below the driver's
	// network.mu and memberlist's node lock; only the broadcast queue's
	// internal (leaf) lock is taken under it. Never call the Sink or a
	// memberlist.Memberlist method, nor block, while holding it.
	mu    lockrank.Mutex[lockrank.Cluster]
	st    *state
	cands map[string]*candidate
	// ownMeta is the meta memberlist holds for this node, as its events
	// report it: metaLoop checks that an update took.
	ownMeta []byte
	// connected is closed when a member other than this node is first
	// alive (Connected); connectOnce closes it.
	connected   chan struct{}
	connectOnce sync.Once
	// comebacks are the addresses of members that came back from gone,
	// for a push/pull by the reconnect goroutine.
	comebacks map[string]bool
	// The pushes (push.go): an outbox per member with something due,
	// those gathering over pushDelay (waiting), those due to a worker
	// (ready); pushCond wakes the workers.
	outboxes   map[string]*outbox
	waiting    []*outbox
	ready      []*outbox
	flushArmed bool
	pushCond   *sync.Cond
	// syncNow lists networks just joined, for an immediate digest exchange.
	syncNow                             []string
	pushesSent, pushErrors, pushDropped uint64
	syncsOut, syncsIn                   uint64

	numAlive atomic.Int64 // alive members incl. self; read by the queue
	// live holds the alive members' gossip addresses, for the transport
	// screen, which asks for every stream and datagram: a copy replaced
	// whole under mu (membersChangedLocked), read without it.
	live atomic.Pointer[liveAddrs]
	// wireLo, wireHi are the wire versions this node speaks (wireMin,
	// wireMax but in tests); bcastVer the one its broadcasts go out at
	// (wireBroadcast within that range, wire.go). Set in New.
	wireLo, wireHi, bcastVer byte
	restartsSent, restartsIn atomic.Uint64
	restartTO                time.Duration // bound on the restart announcement in Close
	// recvd counts the plugin's messages received (NotifyMsg) by wire
	// version and kind, for tests of the negotiation.
	recvd                       [wireMax + 1][kindSettings + 1]atomic.Uint64
	bytesIn, bytesOut           atomic.Uint64
	msgsIn, statesIn, statesOut atomic.Uint64
	deliveries, sErr            atomic.Uint64
	metaPushPulls               atomic.Uint64
	rej                         rejections
	// logLim rate-limits the log lines of refusals (ratelog.go).
	logLim *logLimiter

	deliverCh chan struct{} // 1-buffered wake-ups of the delivery goroutine
	metaCh    chan struct{} // 1-buffered wake-ups of the meta gossip goroutine
	joinCh    chan struct{} // 1-buffered wake-ups of the rejoin goroutine
	backCh    chan struct{} // 1-buffered wake-ups of the reconnect goroutine
	// settingsDue are the members due this node's settings, with the
	// sends tried so far (guarded by mu); settingsCh wakes their sender
	// (settings.go).
	settingsDue map[string]int
	settingsCh  chan struct{}
	syncCh      chan struct{} // 1-buffered wake-ups of the anti-entropy goroutine
	stop        chan struct{}
	// streams ends the TCP streams of this node's memberlist transport
	// (dials and open connections) at Close; see abortableTransport.
	streams       context.Context
	cancelStreams context.CancelFunc
	// pool holds the sessions to members (streampool.go); nil with a
	// transport of the caller's. muxPeers are the members that take
	// sessions (name → struct{}), read by the transport without c.mu.
	pool     *streamPool
	muxPeers sync.Map
	// channels are the channel connections with members, by name
	// (channel.go); chMu guards the map and its values, a leaf but for a
	// channel's mu, taken after it. screen reads the channels this node
	// dialed. keys are the gossip keys (keyring.go), tcpTimeout
	// memberlist's.
	chMu           lockrank.Mutex[lockrank.Channels]
	channels       map[string]*peerChannels
	channelsDialed atomic.Uint64
	screen         *screenTransport
	keys           *keyring
	mlKeyring      *memberlist.Keyring // memberlist's, in step with keys (SetKeys); nil without
	tcpTimeout     time.Duration
	closed         atomic.Bool
	closeOnce      sync.Once
	closeErr       error
	wg             sync.WaitGroup
}

// New creates the memberlist, starts the goroutines and joins the seeds in
// the background: start-up never waits for other nodes.
func New(cfg Config) (*Cluster, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("cluster: NodeName is required")
	}
	if len(cfg.NodeName) > maxIDLen {
		return nil, fmt.Errorf("cluster: NodeName longer than %d bytes", maxIDLen)
	}
	if strings.ContainsFunc(cfg.NodeName, unicode.IsControl) {
		return nil, fmt.Errorf("cluster: NodeName %q has control characters", cfg.NodeName)
	}
	adv := cfg.AdvertiseAddr.Unmap()
	if !adv.IsValid() || adv.IsUnspecified() || adv.IsMulticast() || adv.Zone() != "" {
		return nil, fmt.Errorf("cluster: AdvertiseAddr %v is not a usable unicast address", cfg.AdvertiseAddr)
	}
	if cfg.SecretKey == nil && len(cfg.AcceptKeys) > 0 {
		return nil, errors.New("cluster: AcceptKeys without a SecretKey")
	}
	if cfg.SecretKey != nil {
		if err := checkKeys(append([][]byte{cfg.SecretKey}, cfg.AcceptKeys...)); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	if err := checkKeyIDs(cfg.KeyIDs); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = "0.0.0.0"
	}
	if cfg.DeadGrace <= 0 {
		cfg.DeadGrace = DefaultDeadGrace
	}
	if cfg.RestartGrace <= 0 {
		cfg.RestartGrace = DefaultRestartGrace
	}
	if cfg.wireRange == [2]byte{} {
		cfg.wireRange = [2]byte{wireMin, wireMax}
	}
	if cfg.TombstoneTTL <= 0 {
		cfg.TombstoneTTL = DefaultTombstoneTTL
	}
	if cfg.RejoinInterval <= 0 {
		cfg.RejoinInterval = DefaultRejoinInterval
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	logLim := newLogLimiter(cfg.Clock, rejectLogEvery)
	lg := slog.New(rateHandler{cfg.Logger.Handler(), logLim}).With("component", "cluster", "node", cfg.NodeName)
	if cfg.TombstoneTTL < cfg.DeadGrace {
		// A node cut off for less than the grace keeps the records it had;
		// if the tombstones that delete them expired meanwhile, it brings
		// them back (until their owners retract them again).
		lg.Warn("tombstone TTL below dead grace", "why", "deleted endpoints can briefly come back after a partition",
			"tombstoneTTL", cfg.TombstoneTTL, "deadGrace", cfg.DeadGrace)
	}
	if cfg.SecretKey == nil {
		lg.Warn("gossip unauthenticated", "why", "anyone who can reach the gossip port can inject endpoints", "hint", "set a 32-byte secret key (--secret-file)")
	}

	c := &Cluster{
		name:        cfg.NodeName,
		log:         lg,
		logLim:      logLim,
		clock:       cfg.Clock,
		sink:        cfg.Sink,
		rejoin:      cfg.RejoinInterval,
		syncInt:     cfg.SyncInterval,
		cands:       map[string]*candidate{},
		comebacks:   map[string]bool{},
		outboxes:    map[string]*outbox{},
		syncCh:      make(chan struct{}, 1),
		deliverCh:   make(chan struct{}, 1),
		metaCh:      make(chan struct{}, 1),
		joinCh:      make(chan struct{}, 1),
		backCh:      make(chan struct{}, 1),
		settingsDue: map[string]int{},
		settingsCh:  make(chan struct{}, 1),
		stop:        make(chan struct{}),
		connected:   make(chan struct{}),
		wireLo:      cfg.wireRange[0],
		wireHi:      cfg.wireRange[1],
		restartTO:   restartAnnounceTimeout,
	}
	c.bcastVer = min(max(wireBroadcast, c.wireLo), c.wireHi)
	c.streams, c.cancelStreams = context.WithCancel(context.Background())
	epoch := uint64(max(cfg.Clock().UnixNano(), 1))
	c.pushCond = sync.NewCond(&c.mu)
	c.st = newState(cfg.NodeName, adv, epoch, cfg.DeadGrace, cfg.TombstoneTTL, lg)
	if cfg.AwaitOwn {
		c.st.heldOwn = map[key]*record{}
	}
	c.st.port = cfg.Settings.VXLANPort
	c.st.restartGrace = max(cfg.RestartGrace, cfg.DeadGrace)
	c.st.settle = settleIntervals * cfg.SyncInterval
	meta := encodeMeta(adv, epoch, nil)
	c.meta.Store(&meta)
	c.adv, c.epoch, c.nodeData, c.settings, c.keyIDs = adv, epoch, cfg.NodeData, cfg.Settings, slices.Clone(cfg.KeyIDs)
	c.memberKeyIDs = cfg.MemberKeyIDs
	c.memberVTEPs = cfg.MemberVTEPs
	c.sweepInt = min(max(min(cfg.DeadGrace, cfg.TombstoneTTL)/20, 5*time.Millisecond), time.Second)

	mc := memberlist.DefaultLANConfig()
	// Anti-entropy repairs whatever a burst of broadcasts missed (memberlist
	// may spend a message's few transmissions on one peer); the LAN default
	// of 30 s left hosts stale that long under churn. The table is small,
	// about 64 bytes a record before compression.
	mc.PushPullInterval = 10 * time.Second
	// No LZW: memberlist allocates a fresh compressor for every message
	// (tens of KiB), and this protocol's records are compact binary that
	// LZW does not shrink. Measured in the 200-host, 20,000-endpoint
	// simulation (scenario d at -scale.fraction 0.2): with compression the
	// wire carried 1.6% more bytes, and the rollout cost 2.2× the CPU,
	// half of it LZW and the collection of its garbage.
	mc.EnableCompression = false
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = adv.String()
	mc.AdvertisePort = cfg.BindPort
	mc.Transport = cfg.Transport
	c.keys = newKeyring(cfg.SecretKey, cfg.AcceptKeys...)
	if cfg.SecretKey != nil {
		// memberlist seals its own messages with the keyring's primary
		// (SetKeys keeps it in step with c.keys).
		ring, err := memberlist.NewKeyring(cfg.AcceptKeys, cfg.SecretKey)
		if err != nil {
			c.cancelStreams()
			return nil, fmt.Errorf("cluster: %w", err)
		}
		mc.Keyring, c.mlKeyring = ring, ring
		// The screen (screen.go) decrypts and checks every datagram and
		// every stream's message, and hands memberlist the plaintext:
		// memberlist must take it as such rather than decrypt it again.
		// It never sees input the screen did not check.
		mc.GossipVerifyIncoming = false
		mc.GossipVerifyOutgoing = true
	}
	mc.Logger = log.New(&mlLogWriter{log: lg.With("component", "memberlist"), reject: c.reject, stopping: c.closed.Load,
		wire: wireRangeString(c.wireLo, c.wireHi)}, "", 0)
	// The wire versions this node speaks go in memberlist's delegate
	// protocol fields, which every alive message and push/pull carries
	// (Node.DMin, DMax). DelegateProtocolVersion, the "current" one, is
	// the lowest: memberlist's verifyProtocol (state.go, run on every
	// push/pull merge) computes the cluster's common range, the highest
	// DMin to the lowest DMax of every alive node on both sides, and
	// fails the merge if any node's current version is outside it. With a
	// 0.1.0 node ([2,2]) alive the common range is [2,2], so a current 3
	// here would break every push/pull with it, both ways; 2 passes with
	// [2,2] and [2,3] alike. Which version a message goes out at is this
	// package's choice, per message (wire.go), not memberlist's. A later
	// release that drops version 2 may raise the current version once no
	// node that speaks only 2 is left.
	mc.DelegateProtocolVersion, mc.DelegateProtocolMin, mc.DelegateProtocolMax = c.wireLo, c.wireLo, c.wireHi
	if cfg.MemberlistConfig != nil {
		cfg.MemberlistConfig(mc)
	}
	mc.Name = cfg.NodeName
	mc.Delegate = &delegate{c}
	mc.Events = &events{c}
	mc.Alive = &aliveFilter{c: c, next: mc.Alive}
	if mc.LogOutput != nil { // a test's; the transport below needs a Logger
		mc.Logger, mc.LogOutput = log.New(mc.LogOutput, "", log.LstdFlags), nil
	}
	if mc.Transport == nil {
		t, err := newAbortableTransport(c.streams, mc)
		if err != nil {
			c.cancelStreams()
			return nil, fmt.Errorf("cluster: %w", err)
		}
		if c.wireHi >= wireMux {
			t.pool = newStreamPool(c.streams, t.dialPlain, c.takesSessions, mc.Logger)
			c.pool = t.pool
		}
		mc.Transport = t
	}
	nat, ok := mc.Transport.(memberlist.NodeAwareTransport)
	if !ok {
		c.cancelStreams()
		return nil, errors.New("cluster: the Transport must be a memberlist.NodeAwareTransport")
	}
	screen := newScreenTransport(nat, c.keys, c.refuseInput, c.isMemberAddr)
	if c.pool != nil {
		screen.acceptSessions(mc.Logger, c.isMemberGossipAddr, c.pool,
			channelSink{from: c.channelDialer, taken: c.channelTaken, ended: c.channelEnded, deliver: (&delegate{c}).NotifyMsg})
	}
	mc.Transport = screen
	c.screen = screen
	c.channels, c.tcpTimeout = map[string]*peerChannels{}, mc.TCPTimeout

	c.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(max(c.numAlive.Load(), 1)) },
		RetransmitMult: mc.RetransmitMult,
	}
	c.probeInt = mc.ProbeInterval
	c.leaveTO = min(max(10*mc.GossipInterval, 100*time.Millisecond), 3*time.Second)
	// Nothing waits for the meta broadcast to go out (a push/pull follows
	// it), but a dropped update shows only as this timeout.
	c.metaTO = max(2*mc.GossipInterval, 20*time.Millisecond)

	for _, s := range cfg.Join {
		if s == "" {
			continue
		}
		c.cands[s] = &candidate{kinds: candSeed}
	}

	ml, err := memberlist.Create(mc)
	if err != nil {
		if cfg.Transport == nil {
			screen.Shutdown() // and the transport made here
		} else {
			screen.detach()
		}
		c.cancelStreams()
		return nil, fmt.Errorf("cluster: start memberlist: %w", err)
	}
	c.ml = ml
	self := ml.LocalNode()
	c.port = int(self.Port)
	c.selfAddr = self.Address()
	if c.pool != nil {
		a := c.selfAddr
		c.pool.self.Store(&a)
	}
	// Seeds without a port use the gossip port; normalise them now that
	// the port is known (BindPort 0 picks one).
	c.mu.Lock()
	for s, cand := range c.cands {
		if n := c.withPort(s); n != s {
			delete(c.cands, s)
			c.cands[n] = cand
		}
	}
	c.mu.Unlock()

	c.wg.Add(7 + pushWorkers)
	go c.settingsLoop()
	go c.deliverLoop()
	go c.sweepLoop()
	go c.rejoinLoop()
	go c.reconnectLoop()
	go c.metaLoop()
	go c.syncLoop()
	for range pushWorkers {
		go c.pushWorker()
	}
	lg.Info("gossip started", "addr", c.selfAddr, "vtep", adv, "epoch", epoch, "seeds", len(cfg.Join), "encrypted", cfg.SecretKey != nil,
		"wireVersions", wireRangeString(c.wireLo, c.wireHi))
	return c, nil
}

// withPort returns host:port for an address that may lack the port.
func (c *Cluster) withPort(s string) string {
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return netip.AddrPortFrom(a.Unmap(), uint16(c.port)).String()
	}
	return net.JoinHostPort(s, strconv.Itoa(c.port))
}

// Connected is closed once another member is alive: from then on the
// remote endpoints reach the Sink within about a push (the joining
// push/pull carries the memberships, and each member pushes its records
// to a node new in its networks). Part of driver.ControlPlane.
func (c *Cluster) Connected() <-chan struct{} { return c.connected }

// Delivered reports whether the member that advertises vtep is alive and
// has pushed its records to this node (or exchanged digests with it) since
// it became alive here: its endpoints are all known, so an endpoint of it
// this node lacks is gone.
func (c *Cluster) Delivered(vtep netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, m := range c.st.members {
		if m.alive && m.delivered && m.vtep == vtep && name != c.name {
			return true
		}
	}
	return false
}

// SetNodeData publishes data (at most MaxNodeData bytes, opaque to the
// cluster) in this node's memberlist meta; other nodes receive it through
// Config.NodeData. It does not block: the update is gossiped in the
// background.
func (c *Cluster) SetNodeData(data []byte) error {
	if len(data) > MaxNodeData {
		return fmt.Errorf("cluster: node data is %d bytes, at most %d fit in memberlist's meta", len(data), MaxNodeData)
	}
	meta := encodeMeta(c.adv, c.epoch, data)
	c.meta.Store(&meta)
	c.wake(c.metaCh)
	return nil
}

// metaLoop gossips the node meta whenever SetNodeData changed it; bursts
// coalesce, and UpdateNode reads the newest meta.
//
// The meta carries the encryption keys, and a new key generation must reach
// every member within its lead time, or the traffic sent with it is dropped.
// UpdateNode's broadcast is best effort, and nobody acknowledges it: in the
// VM, with three nodes rotating within 200 ms, one node's broadcast never
// arrived anywhere, so its keys waited for a periodic push/pull that came
// after the generation activated. So every meta change also goes by
// push/pull (TCP) to a few members, which gossip it on. Meta changes a few
// times an hour; periodic push/pulls are hundreds.
func (c *Cluster) metaLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-c.metaCh:
		}
		for attempt := 1; !c.updateMeta(attempt); attempt++ {
			select {
			case <-c.stop:
				return
			case <-time.After(c.metaTO):
			}
		}
		c.pushMeta()
	}
}

// updateMeta has memberlist take the current meta as this node's and
// gossip it, and reports whether it did. It may not: UpdateNode numbers
// its alive message before it takes memberlist's node lock, and a refute
// in between (a push/pull saying that we are suspect or dead) raises our
// incarnation past that number, so the message is dropped without a word
// and the old meta stays, which every later push/pull spreads. A restart
// sets this up: the first push/pull from a peer both makes us refute and
// brings the peers' keys, whose arrival starts our new key generation. In
// the VM that left the new keys unknown to every peer for 19 s, past the
// generation's activation.
func (c *Cluster) updateMeta(attempt int) bool {
	want := *c.meta.Load()
	err := c.ml.UpdateNode(c.metaTO)
	c.mu.Lock()
	took := bytes.Equal(c.ownMeta, want)
	c.mu.Unlock()
	if !took {
		level := slog.LevelDebug
		if attempt == 1 {
			level = slog.LevelInfo
		}
		c.log.Log(context.Background(), level, "node data update retried", "why", "memberlist dropped the update", "attempt", attempt, "err", err)
	}
	return took
}

// pushMeta does a push/pull with up to metaPushFanout random alive members.
func (c *Cluster) pushMeta() {
	c.mu.Lock()
	var addrs []string
	for _, m := range c.st.members {
		if m.alive && m.name != c.name && m.addr.IsValid() {
			addrs = append(addrs, m.addr.String())
		}
	}
	c.mu.Unlock()
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	addrs = addrs[:min(len(addrs), metaPushFanout)]
	if len(addrs) == 0 {
		return
	}
	c.metaPushPulls.Add(1)
	if n, err := c.ml.Join(addrs); err != nil {
		c.log.Warn("push/pull of node data", "reached", n, "of", len(addrs), "err", err)
	}
}

// MaxNodeData is what SetNodeData accepts: memberlist's meta limit less
// our own header (version, address, epoch).
const MaxNodeData = memberlist.MetaMaxSize - 2 - 16 - 8

// Close is a stop on purpose (the plugin's SIGTERM: a disable, upgrade or
// settings change, after which the plugin is back): it tells the alive
// members that speak wire version 3 that this instance is restarting, so
// that they keep its records for their RestartGrace (restart.go; at most
// about a second), then leaves the cluster gracefully (bounded by a few
// gossip intervals), stops the goroutines and shuts memberlist down. No
// Sink call is made once it returns. Idempotent.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.announceRestart()
		c.shutdown(true)
	})
	return c.closeErr
}

// shutdown stops the goroutines and memberlist, after a graceful leave if
// leave is set (a crash has none).
func (c *Cluster) shutdown(leave bool) {
	c.mu.Lock()
	c.closed.Store(true)
	c.pushCond.Broadcast()
	c.mu.Unlock()
	close(c.stop)
	c.cancelStreams()
	if leave {
		if err := c.ml.Leave(c.leaveTO); err != nil {
			c.log.Debug("graceful leave", "err", err)
		}
	}
	c.closeErr = c.ml.Shutdown()
	c.wg.Wait()
	c.log.Info("gossip stopped")
}

// OwnSettled says the owner has republished every endpoint it holds
// (Config.AwaitOwn): records under this node's name from an earlier
// incarnation that it does not hold are retracted now.
func (c *Cluster) OwnSettled() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.heldOwn == nil {
		return
	}
	c.st.settleOwn(c.clock())
	c.flushLocked()
}

// Publish announces a local endpoint that joined networkID. p.Local is
// true on input; the record is published with VTEP = AdvertiseAddr. Called
// with a driver network lock held: quick, never calls the Sink.
func (c *Cluster) Publish(networkID string, p peerdb.Peer) {
	if c.closed.Load() {
		return
	}
	c.mu.Lock()
	err := c.st.publish(networkID, p, c.clock())
	c.flushLocked()
	c.mu.Unlock()
	if err != nil {
		c.log.Error("endpoint not published", "network", networkID, "endpoint", p.EndpointID, "err", err)
	}
}

// Retract withdraws a local endpoint that left: a tombstone newer than its
// record. Called with a driver network lock held.
func (c *Cluster) Retract(networkID, endpointID string) {
	if c.closed.Load() {
		return
	}
	c.mu.Lock()
	c.st.retract(networkID, endpointID, c.clock())
	c.flushLocked()
	c.mu.Unlock()
}

// Snapshot returns copies of the live remote records of the network
// (excluding this node's own), sorted by endpoint id, for replay into a new
// sandbox. Called with a driver network lock held.
func (c *Cluster) Snapshot(networkID string) []peerdb.Peer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.snapshot(networkID)
}

// NetworkAdded says the network now exists locally (AddPeer would find
// it): this node announces that it has the network, so that the other
// nodes send it the network's records, starts a digest exchange for it at
// once, and delivers all its remote records to the Sink again,
// asynchronously. Called with a driver network lock held.
func (c *Cluster) NetworkAdded(networkID string) {
	if c.closed.Load() {
		return
	}
	c.mu.Lock()
	c.st.joinNetwork(networkID)
	c.flushLocked()
	c.syncNow = append(c.syncNow, networkID)
	c.mu.Unlock()
	c.wake(c.deliverCh)
	c.wake(c.syncCh)
}

// NetworkRemoved says the network no longer exists locally: this node
// withdraws its membership, retracts its endpoints there, if any are
// left, and forgets the other nodes' records of it. Called with a driver
// network lock held.
func (c *Cluster) NetworkRemoved(networkID string) {
	if c.closed.Load() {
		return
	}
	c.mu.Lock()
	c.st.leaveNetwork(networkID, c.clock())
	c.flushLocked()
	c.mu.Unlock()
}

func (c *Cluster) wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// deliverLoop is the single goroutine that calls the Sink.
func (c *Cluster) deliverLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-c.deliverCh:
		}
		for {
			c.mu.Lock()
			vteps, vtepsChanged := c.st.takeVTEPs()
			batch := c.st.takeDirty()
			data := c.st.takeDataDirty()
			keyIDs := c.takeKeyIDsLocked()
			c.mu.Unlock()
			if len(batch) == 0 && len(data) == 0 && len(keyIDs) == 0 && !vtepsChanged {
				break
			}
			for vtep, ids := range keyIDs {
				c.memberKeyIDs(vtep, ids)
			}
			if vtepsChanged && c.memberVTEPs != nil {
				c.memberVTEPs(vteps)
			}
			if c.nodeData != nil {
				for _, nd := range data {
					c.nodeData(nd.vtep, nd.data)
				}
			}
			if !c.deliverRound(batch) {
				return
			}
		}
	}
}

// deliverRound hands one round of deliveries to the sink, false if the
// cluster stopped meanwhile. A BatchSink gets each network's additions in
// one call: they are distinct endpoints at their current values, so their
// order does not matter.
func (c *Cluster) deliverRound(batch []delivery) bool {
	stopped := func() bool {
		select {
		case <-c.stop:
			return true
		default:
			return false
		}
	}
	bs, ok := c.sink.(BatchSink)
	if !ok {
		for _, d := range batch {
			if stopped() {
				return false
			}
			c.deliver(d)
		}
		return true
	}
	slices.SortFunc(batch, func(a, b delivery) int {
		if r := strings.Compare(a.nid, b.nid); r != 0 {
			return r
		}
		return cmpBool(a.add, b.add)
	})
	var peers []peerdb.Peer
	for i := 0; i < len(batch); {
		if stopped() {
			return false
		}
		d := batch[i]
		if !d.add {
			c.deliver(d)
			i++
			continue
		}
		peers = peers[:0]
		j := i
		for ; j < len(batch) && batch[j].add && batch[j].nid == d.nid; j++ {
			peers = append(peers, batch[j].peer)
		}
		err := bs.AddPeers(d.nid, peers)
		c.deliveries.Add(uint64(j - i))
		if err != nil {
			c.sErr.Add(1)
			c.log.Debug("remote endpoint changes not applied", "network", d.nid, "endpoints", j-i, "err", err)
		}
		i = j
	}
	return true
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func (c *Cluster) deliver(d delivery) {
	if c.sink == nil {
		return
	}
	var err error
	if d.add {
		err = c.sink.AddPeer(d.nid, d.peer)
	} else {
		err = c.sink.DeletePeer(d.nid, d.eid)
	}
	c.deliveries.Add(1)
	if err != nil {
		c.sErr.Add(1)
		c.log.Debug("remote endpoint change not applied", "network", d.nid, "endpoint", d.eid, "add", d.add, "err", err)
	}
}

// sweepLoop does the time-driven table work on the injected clock.
func (c *Cluster) sweepLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.sweepInt)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		c.st.sweep(c.clock())
		dirty := c.st.hasDirty()
		c.pruneCandidatesLocked()
		c.mu.Unlock()
		if dirty {
			c.wake(c.deliverCh)
		}
		c.logLim.flush()
	}
}

// MemberState is a member's state as this node sees it.
type MemberState string

const (
	MemberAlive MemberState = "alive"
	// MemberGone: left or failed; its records are kept until DeadGrace.
	MemberGone MemberState = "gone"
	// MemberPurged: gone past DeadGrace; its records were removed.
	MemberPurged MemberState = "purged"
	// MemberRestarting: gone after announcing that it was being restarted;
	// its records are kept until RestartGrace.
	MemberRestarting MemberState = "restarting"
)

// Member is a copy of this node's view of one member.
type Member struct {
	Name    string         `json:"name"`
	Addr    netip.AddrPort `json:"addr"`  // gossip address
	VTEP    netip.Addr     `json:"vtep"`  // from its meta
	Epoch   uint64         `json:"epoch"` // its instance id (start time, ns) from its meta
	State   MemberState    `json:"state"`
	Since   time.Time      `json:"since"` // last change of State, on this node's clock
	Self    bool           `json:"self,omitempty"`
	Records int            `json:"records"` // live records it owns in this node's table
	// KeptUntil, for a gone or restarting member, is when its records
	// will be removed (Since plus DeadGrace or RestartGrace).
	KeptUntil time.Time `json:"keptUntil,omitzero"`
	// Wire is the range of wire versions it speaks ("2..3"), as its
	// memberlist node advertises it; empty while unknown.
	Wire string `json:"wire,omitempty"`
	// Settings are what its current instance said of its settings; zero
	// while it said nothing (a 0.1.0 node never does).
	Settings Settings `json:"settings,omitzero"`
	// KeyIDs are the ids of the cluster secrets it holds, primary first,
	// as its current instance said them; empty while it said none.
	KeyIDs []string `json:"keyIDs,omitempty"`
}

// Members returns copies of every member this node knows, alive or not,
// sorted by name.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	records := map[string]int{}
	for _, owners := range c.st.digests {
		for owner, d := range owners {
			records[owner] += int(d.count)
		}
	}
	out := make([]Member, 0, len(c.st.members))
	for _, m := range c.st.members {
		mm := Member{Name: m.name, Addr: m.addr, VTEP: m.vtep, Epoch: m.epoch, Since: m.since, Self: m.name == c.name, Wire: m.wireString()}
		if a, ok := c.st.adverts[m.name]; ok && a.epoch == m.epoch {
			mm.Settings, mm.KeyIDs = a.Settings, slices.Clone(a.keyIDs)
		}
		if mm.Self {
			mm.Settings, mm.KeyIDs = c.settings, slices.Clone(c.keyIDs)
		}
		switch {
		case m.alive:
			mm.State = MemberAlive
		case m.purged:
			mm.State = MemberPurged
		case m.restartMarked():
			mm.State = MemberRestarting
		default:
			mm.State = MemberGone
		}
		if !m.alive && !m.purged {
			mm.KeptUntil = m.since.Add(c.st.grace(m))
		}
		mm.Records = records[m.name]
		out = append(out, mm)
	}
	sortMembers(out)
	return out
}

// Stats are counters and gauges for metrics. Counters are monotonic since
// New; bytes count this package's payloads (gossip messages and push/pull
// state), not memberlist's own protocol traffic.
type Stats struct {
	Records           int // live endpoint records, own and remote, of the networks this node has
	OwnRecords        int // live records published by this node
	Tombstones        int
	Networks          int // networks this node has (and so receives the records of)
	Memberships       int // nodes' live memberships of networks, cluster-wide
	Pending           int // records held until their owner joins
	MembersAlive      int // including this node
	MembersGone       int // gone, records still kept (within DeadGrace or RestartGrace), restarting ones included
	MembersRestarting int // gone after announcing a restart: records kept for RestartGrace
	BroadcastsQueued  int
	Epoch             uint64

	BytesSent, BytesReceived uint64
	MessagesReceived         uint64 // gossip messages
	StatesReceived           uint64 // push/pull merges
	StatesSent               uint64
	Accepted                 uint64 // remote updates applied from pushes and gossip
	AcceptedFromState        uint64 // remote updates applied from memberlist's push/pull (memberships)
	AcceptedFromSync         uint64 // remote updates applied from anti-entropy
	Ignored                  uint64 // endpoint records of networks this node does not have
	Stale                    uint64 // remote updates older than or equal to what we hold
	Received                 Paths  // remote records received, by path
	StaleFrom                Paths  // the Stale ones, by path: duplicates
	Rejected                 uint64 // sum of the Rejected* counters and DecodeErrors: all refusals but Stale (see Rejections)
	RejectedForeignOwner     uint64
	RejectedVTEP             uint64
	RejectedNotMember        uint64 // owner gone past DeadGrace
	RejectedDecrypt          uint64 // the Rejected* below: see Reason
	RejectedPlain            uint64
	RejectedCompressed       uint64
	RejectedUnknownType      uint64
	RejectedMisdirected      uint64
	RejectedQueueFull        uint64
	RejectedWireVersion      uint64 // a message, or a node, whose wire versions this node does not speak
	RejectedStreamIdle       uint64 // gossip streams that sent no whole first message in time
	RejectedStreamLimit      uint64 // gossip streams over the bound of those not yet checked
	DecodeErrors             uint64 // malformed input: the plugin's messages, memberlist's, compounds, checksums
	Retracted                uint64 // own records of an earlier incarnation tombstoned
	Purged                   uint64 // records of nodes gone past DeadGrace removed
	ExpiredTombstones        uint64
	PendingDropped           uint64
	EpochBumps               uint64
	Deliveries               uint64 // Sink calls
	SinkErrors               uint64
	MetaPushPulls            uint64 // push/pull rounds that carried a node meta change
	PushesSent               uint64 // messages sent straight to a member (pushes and anti-entropy)
	SessionsDialed           uint64 // multiplexed connections dialed to members (streampool.go)
	ChannelsDialed           uint64 // channel connections dialed to members (channel.go)
	StreamsOverSessions      uint64 // gossip streams (every message memberlist sends over TCP) carried by a session
	StreamsOwnConnection     uint64 // gossip streams dialed as a connection of their own (joins, 0.1.0 members)
	PushErrors               uint64 // such messages that could not be sent
	PushesDropped            uint64 // records or messages dropped for a member that is gone
	SyncsSent                uint64 // anti-entropy rounds started with a member
	SyncsReceived            uint64 // anti-entropy messages received
	RestartsAnnounced        uint64 // restart announcements this node sent (Close) that were delivered
	RestartsReceived         uint64 // restart announcements received from other nodes
}

// Stats returns the current counters.
func (c *Cluster) Stats() Stats {
	c.mu.Lock()
	st := c.st
	s := Stats{
		Pending:              st.npend,
		Epoch:                st.epoch,
		Accepted:             st.accepted,
		AcceptedFromState:    st.acceptedFromState,
		AcceptedFromSync:     st.acceptedFromSync,
		Stale:                st.stale,
		Received:             pathsOf(st.received),
		StaleFrom:            pathsOf(st.staleBy),
		RejectedForeignOwner: st.rejectedOwner,
		RejectedVTEP:         st.rejectedVTEP,
		RejectedNotMember:    st.rejectedNotMember,
		Retracted:            st.retracted,
		Purged:               st.purged,
		ExpiredTombstones:    st.expired,
		PendingDropped:       st.pendingDropped,
		EpochBumps:           st.epochBumps,
		Ignored:              st.ignored,
		PushesSent:           c.pushesSent,
		PushErrors:           c.pushErrors,
		PushesDropped:        c.pushDropped,
		SyncsSent:            c.syncsOut,
		SyncsReceived:        c.syncsIn,
	}
	for _, recs := range st.netm {
		for _, r := range recs {
			if !r.Deleted {
				s.Memberships++
				if r.Owner == c.name {
					s.Networks++
				}
			}
		}
	}
	// The digests count every live endpoint record, by owner: Stats is
	// called per metrics scrape and must not scan the table.
	for _, owners := range st.digests {
		for owner, d := range owners {
			s.Records += int(d.count)
			if owner == c.name {
				s.OwnRecords += int(d.count)
			}
		}
	}
	for k := range st.tombs {
		if !isMemberEID(k.eid) {
			s.Tombstones++
		}
	}
	if c.pool != nil {
		s.SessionsDialed, s.StreamsOverSessions, s.StreamsOwnConnection = c.pool.dialed.Load(), c.pool.muxed.Load(), c.pool.plainDials.Load()
		s.ChannelsDialed = c.channelsDialed.Load()
	}
	for _, m := range st.members {
		switch {
		case m.alive:
			s.MembersAlive++
		case !m.purged:
			s.MembersGone++
			if m.restartMarked() {
				s.MembersRestarting++
			}
		}
	}
	c.mu.Unlock()
	s.BroadcastsQueued = c.queue.NumQueued()
	s.BytesSent, s.BytesReceived = c.bytesOut.Load(), c.bytesIn.Load()
	s.MessagesReceived, s.StatesReceived, s.StatesSent = c.msgsIn.Load(), c.statesIn.Load(), c.statesOut.Load()
	s.RejectedDecrypt, s.RejectedPlain = c.rej[RejectDecrypt].Load(), c.rej[RejectPlain].Load()
	s.RejectedCompressed, s.RejectedUnknownType = c.rej[RejectCompressed].Load(), c.rej[RejectUnknownType].Load()
	s.RejectedMisdirected, s.RejectedQueueFull = c.rej[RejectMisdirected].Load(), c.rej[RejectQueueFull].Load()
	s.DecodeErrors = c.rej[RejectMalformed].Load()
	s.RejectedWireVersion = c.rej[RejectWireVersion].Load()
	s.RejectedStreamIdle, s.RejectedStreamLimit = c.rej[RejectStreamIdle].Load(), c.rej[RejectStreamLimit].Load()
	s.RestartsAnnounced, s.RestartsReceived = c.restartsSent.Load(), c.restartsIn.Load()
	for name, v := range s.Rejections() {
		if name != RejectStale.String() {
			s.Rejected += v
		}
	}
	s.Deliveries, s.SinkErrors = c.deliveries.Load(), c.sErr.Load()
	s.MetaPushPulls = c.metaPushPulls.Load()
	return s
}
