package health

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

const (
	// Interval is the time between two probes of a path, ±jitter.
	Interval = 3 * time.Second
	jitter   = 0.2
	// timeout is how long a probe's answer is waited for.
	timeout = time.Second
	// downAfter rounds in a row whose full probe is lost break a path.
	downAfter = 2
	// diagnoseEvery bounds the MTU searches of a path in trouble.
	diagnoseEvery = 30 * time.Second
	// warnEvery bounds a path's WARN lines: a flapping path says how many
	// times it broke since its last one.
	warnEvery = time.Minute
	// tick is the scheduler's resolution, refreshEvery how often the
	// peers are read from the driver and the control plane.
	tick         = 100 * time.Millisecond
	refreshEvery = time.Second
	// smallProbe is the size of the probe that tells a dead path from one
	// that drops only large packets.
	smallProbe = 64
)

// Known is what the control plane says of a peer.
type Known struct {
	Gossip Gossip
	// VXLANPort is the port the peer advertised, 0 if none.
	VXLANPort uint16
	// Old: the peer runs a release without a health endpoint; it is not
	// probed.
	Old bool
}

// Conn is a health endpoint's UDP socket (a *net.UDPConn).
type Conn interface {
	ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
	Close() error
}

// Config is what a Prober needs. Only Conns and Peers are required.
type Config struct {
	// Conns are the endpoints' sockets, by path; without PathESP no ESP
	// path is probed. Run closes them when it returns.
	Conns map[Path]Conn
	// Port is the endpoints' UDP port (EndpointPort); VXLANPort this
	// host's VXLAN port, for the operator's sentences.
	Port, VXLANPort uint16
	// Peers lists the remote VTEPs this host has programmed.
	Peers func() []Peer
	// Sync, if set, is handed every new peer list before it is probed:
	// the endpoints' entries (Endpoints.Sync).
	Sync func([]Peer)
	// Known says what the control plane knows of the peers, by VTEP; a
	// peer it does not name (or a nil Known) is GossipUnknown and probed.
	Known func() map[netip.Addr]Known
	// Interval overrides Interval (tests).
	Interval time.Duration
	Log      *slog.Logger
}

type pathKey struct {
	vtep netip.Addr
	path Path
}

// pathState is one path's books.
type pathState struct {
	key    pathKey
	target int // the size probed: the network's MTU
	next   time.Time
	// fails counts the rounds in a row whose full probe was lost.
	fails int
	// fwd is what this host's probes say of the path to the peer, and
	// fwdMTU the largest packet they saw cross it; back and backMTU are
	// what the peer says of its path back (replies, notices). state is
	// the path's, both ways: reverse marks one broken only the way back.
	fwd, back       State
	fwdMTU, backMTU int
	reverse         bool
	state           State
	since           time.Time
	rtt             time.Duration
	pathMTU         int
	// smallOK: the latest small probe was answered.
	smallOK bool
	// diagnosed is when the last MTU search began.
	diagnosed time.Time
	// warned: a WARN went out for the current trouble; lastWarn when the
	// last did, flaps how many breaks went unsaid since.
	warned   bool
	lastWarn time.Time
	flaps    int
	// gossip and peerPort as the last refresh read them.
	gossip         Gossip
	peerPort       uint16
	sent, answered uint64
}

type roundKind uint8

const (
	// roundCheck: the full probe, and the small one while in trouble.
	roundCheck roundKind = iota
	// roundCoarse and roundFine: the MTU search's bursts.
	roundCoarse
	roundFine
)

// round is a set of probes of one path sent together and judged together.
type round struct {
	ps       *pathState
	kind     roundKind
	sentAt   time.Time
	sizes    []int
	seqs     []uint64
	answered []bool
	left     int // probes not answered yet
	rtt      time.Duration
}

// send is one datagram to write once the lock is released.
type send struct {
	path Path
	to   netip.AddrPort
	msg  message
	// pad is the datagram's size: a probe's IP packet size, 0 for others.
	pad int
}

// event is a log line to write once the lock is released.
type event struct {
	level slog.Level
	msg   string
	attrs []any
}

// Prober probes every peer's paths and keeps their state.
type Prober struct {
	cfg      Config
	interval time.Duration
	log      *slog.Logger

	// mu guards paths, rounds, pending and seq. A leaf lock: nothing else
	// is locked, no socket is written and no line logged while it is
	// held.
	mu      lockrank.Mutex[lockrank.Health]
	paths   map[pathKey]*pathState
	rounds  map[*round]struct{}
	pending map[uint64]*round
	seq     uint64
}

// New returns a Prober; Run starts it.
func New(cfg Config) *Prober {
	p := &Prober{cfg: cfg, interval: cmp.Or(cfg.Interval, Interval), log: cfg.Log,
		paths: map[pathKey]*pathState{}, rounds: map[*round]struct{}{}, pending: map[uint64]*round{}}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p
}

// Run probes until ctx ends, then closes the sockets.
func (p *Prober) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for path, c := range p.cfg.Conns {
		wg.Go(func() { p.serve(path, c) })
	}
	t := time.NewTicker(tick)
	defer func() {
		t.Stop()
		for _, c := range p.cfg.Conns {
			c.Close()
		}
		wg.Wait()
	}()
	var refreshed time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if now.Sub(refreshed) >= refreshEvery {
			p.refresh(now)
			refreshed = now
		}
		p.step(now)
	}
}

// serve answers the peers' probes and hands our probes' answers to their
// rounds.
func (p *Prober) serve(path Path, c Conn) {
	buf := make([]byte, 1<<16)
	var out []byte
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		m, err := parseMessage(buf[:n])
		if err != nil {
			continue
		}
		peer := from.Addr().Unmap()
		switch m.kind {
		case kindProbe:
			reply := p.view(path, peer)
			reply.kind, reply.seq = kindReply, m.seq
			out = appendMessage(out, reply, 0)
			c.WriteToUDPAddrPort(out, from)
		case kindReply:
			p.answer(path, peer, m, time.Now())
		case kindNotice:
			p.heard(path, peer, m, time.Now())
		}
	}
}

// view is what this host says of its own path to peer, for a reply.
func (p *Prober) view(path Path, peer netip.Addr) message {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.paths[pathKey{peer, path}]
	if ps == nil {
		return message{}
	}
	return backView(ps)
}

func backView(ps *pathState) message {
	m := message{state: wireState(ps.fwd)}
	if ps.fwd == StateMTU {
		m.size = uint16(ps.fwdMTU)
	}
	return m
}

func (p *Prober) answer(path Path, from netip.Addr, m message, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.pending[m.seq]
	if r == nil || r.ps.key.path != path || r.ps.key.vtep != from {
		return
	}
	delete(p.pending, m.seq)
	i := slices.Index(r.seqs, m.seq)
	r.answered[i] = true
	r.left--
	r.ps.answered++
	r.ps.back, r.ps.backMTU = wireStates[m.state], int(m.size)
	if i == 0 && r.kind == roundCheck {
		r.rtt = now.Sub(r.sentAt)
	}
}

// heard takes a peer's notice of a change of its path back: a black hole
// only that way is known here as soon as there.
func (p *Prober) heard(path Path, from netip.Addr, m message, now time.Time) {
	var events []event
	p.mu.Lock()
	if ps := p.paths[pathKey{from, path}]; ps != nil {
		ps.back, ps.backMTU = wireStates[m.state], int(m.size)
		if ps.fwd == StateUp {
			p.settle(ps, now, &events)
		}
	}
	p.mu.Unlock()
	p.logEvents(events)
}

// settle sets the state of a path whose probes cross: up, unless the peer
// says its packets back are lost above some size. Caller holds mu.
func (p *Prober) settle(ps *pathState, now time.Time, events *[]event) {
	if ps.back == StateMTU {
		ps.reverse = true
		ps.pathMTU = ps.target
		if ps.backMTU > 0 {
			ps.pathMTU = min(ps.target, ps.backMTU)
		}
		p.transition(ps, StateMTU, now, events)
		return
	}
	ps.reverse, ps.pathMTU = false, ps.fwdMTU
	p.transition(ps, StateUp, now, events)
}

// refresh reads the peers and what the control plane says of them, then
// brings the paths in line.
func (p *Prober) refresh(now time.Time) {
	peers := p.cfg.Peers()
	if p.cfg.Sync != nil {
		p.cfg.Sync(peers)
	}
	var known map[netip.Addr]Known
	if p.cfg.Known != nil {
		known = p.cfg.Known()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := map[pathKey]bool{}
	for _, pe := range peers {
		kn := known[pe.VTEP]
		for _, path := range []Path{PathVXLAN, PathESP} {
			target := pe.MTU
			if path == PathESP {
				target = pe.ESPMTU
			}
			if _, ok := p.cfg.Conns[path]; !ok || target == 0 {
				continue
			}
			k := pathKey{pe.VTEP, path}
			keep[k] = true
			ps := p.paths[k]
			if ps == nil {
				// The first probe falls anywhere in the first interval, so
				// that peers found together are not probed together.
				ps = &pathState{key: k, state: StateUnknown, fwd: StateUnknown, back: StateUnknown, since: now,
					next: now.Add(time.Duration(rand.Int64N(int64(p.interval))))}
				p.paths[k] = ps
			}
			ps.target, ps.gossip, ps.peerPort = target, kn.Gossip, kn.VXLANPort
			if kn.Old {
				ps.state, ps.fwd, ps.fails = StateUnprobed, StateUnknown, 0
			} else if ps.state == StateUnprobed {
				ps.state, ps.since = StateUnknown, now
			}
		}
	}
	for k := range p.paths {
		if !keep[k] {
			delete(p.paths, k)
		}
	}
	for r := range p.rounds {
		if !keep[r.ps.key] {
			p.dropRound(r)
		}
	}
}

func (p *Prober) dropRound(r *round) {
	delete(p.rounds, r)
	for _, s := range r.seqs {
		delete(p.pending, s)
	}
}

// step judges the rounds that are over and sends the probes that are due.
func (p *Prober) step(now time.Time) {
	var sends []send
	var events []event
	p.mu.Lock()
	for r := range p.rounds {
		if r.left == 0 || now.Sub(r.sentAt) >= timeout {
			p.dropRound(r)
			sends = p.judge(r, now, sends, &events)
		}
	}
	for _, ps := range p.paths {
		if ps.state == StateUnprobed || now.Before(ps.next) {
			continue
		}
		j := 1 + jitter*(2*rand.Float64()-1)
		ps.next = now.Add(time.Duration(float64(p.interval) * j))
		sizes := []int{ps.target}
		if ps.fails > 0 || (ps.state != StateUp && ps.state != StateUnknown) {
			sizes = append(sizes, smallProbe)
		}
		sends = p.launch(ps, roundCheck, sizes, now, sends)
	}
	p.mu.Unlock()
	p.write(sends)
	p.logEvents(events)
}

func (p *Prober) logEvents(events []event) {
	for _, e := range events {
		p.log.Log(context.Background(), e.level, e.msg, e.attrs...)
	}
}

// launch starts a round of probes of the given sizes. Caller holds mu.
func (p *Prober) launch(ps *pathState, kind roundKind, sizes []int, now time.Time, sends []send) []send {
	r := &round{ps: ps, kind: kind, sentAt: now, sizes: sizes, seqs: make([]uint64, len(sizes)),
		answered: make([]bool, len(sizes)), left: len(sizes)}
	for i, size := range sizes {
		p.seq++
		r.seqs[i] = p.seq
		p.pending[p.seq] = r
		sends = append(sends, send{path: ps.key.path, to: netip.AddrPortFrom(ps.key.vtep, p.cfg.Port),
			msg: message{kind: kindProbe, size: uint16(size), seq: p.seq}, pad: payload(ps.key.vtep, size)})
	}
	ps.sent += uint64(len(sizes))
	p.rounds[r] = struct{}{}
	return sends
}

// judge reads a finished round. Caller holds mu.
func (p *Prober) judge(r *round, now time.Time, sends []send, events *[]event) []send {
	ps := r.ps
	if p.paths[ps.key] != ps {
		return sends
	}
	was := ps.fwd
	switch r.kind {
	case roundCheck:
		if r.answered[0] {
			ps.fails, ps.rtt, ps.fwdMTU, ps.smallOK, ps.fwd = 0, r.rtt, ps.target, true, StateUp
			p.settle(ps, now, events)
			break
		}
		ps.fails++
		if len(r.answered) > 1 {
			ps.smallOK = r.answered[1]
		}
		if ps.fails == 1 || now.Sub(ps.diagnosed) >= diagnoseEvery {
			ps.diagnosed = now
			sends = p.launch(ps, roundCoarse, append([]int{smallProbe}, ladder(minProbe, ps.target)...), now, sends)
		}
		if ps.fails >= downAfter {
			ps.fwd = StateDown
			if ps.smallOK {
				ps.fwd = StateMTU
			}
			ps.reverse, ps.pathMTU = false, ps.fwdMTU
			p.transition(ps, ps.fwd, now, events)
		}
	case roundCoarse, roundFine:
		if r.kind == roundCoarse && r.answered[0] {
			ps.smallOK = true
		}
		best, lo, hi := narrow(r.sizes, r.answered)
		if r.kind == roundCoarse || best > ps.fwdMTU {
			ps.fwdMTU = best
		}
		if !ps.reverse {
			ps.pathMTU = ps.fwdMTU
		}
		if r.kind == roundCoarse && best >= minProbe && lo <= hi {
			sends = p.launch(ps, roundFine, ladder(lo, hi), now, sends)
		}
	}
	if ps.fwd != was && was != StateUnknown {
		// The peer hears of it now, not at its next probe's answer.
		n := backView(ps)
		n.kind = kindNotice
		sends = append(sends, send{path: ps.key.path, to: netip.AddrPortFrom(ps.key.vtep, p.cfg.Port), msg: n})
	}
	return sends
}

// transition moves a path to st, saying so within the WARN bound.
// Caller holds mu.
func (p *Prober) transition(ps *pathState, st State, now time.Time, events *[]event) {
	if ps.state == st {
		return
	}
	was, since := ps.state, ps.since
	ps.state, ps.since = st, now
	attrs := []any{"peer", ps.key.vtep, "path", ps.key.path}
	switch {
	case st == StateUp && ps.warned:
		ps.warned = false
		*events = append(*events, event{slog.LevelInfo, "data path restored", append(attrs, "was", was, "for", now.Sub(since).Round(time.Second))})
	case st == StateDown || st == StateMTU:
		if !ps.lastWarn.IsZero() && now.Sub(ps.lastWarn) < warnEvery {
			ps.flaps++
			return
		}
		attrs = append(attrs, "state", st, "why", p.problemOf(ps))
		if ps.flaps > 0 {
			attrs = append(attrs, "breaks_unsaid", ps.flaps)
		}
		ps.warned, ps.lastWarn, ps.flaps = true, now, 0
		*events = append(*events, event{slog.LevelWarn, "data path broken", attrs})
	}
}

// problemOf is ps's operator sentence. Caller holds mu.
func (p *Prober) problemOf(ps *pathState) string {
	f := facts{peer: ps.key.vtep, path: ps.key.path, state: ps.state, port: p.cfg.VXLANPort,
		peerPort: ps.peerPort, gossip: ps.gossip, mtu: ps.target, pathMTU: ps.pathMTU, plain: StateUnknown, reverse: ps.reverse}
	if plain := p.paths[pathKey{ps.key.vtep, PathVXLAN}]; plain != nil {
		f.plain = plain.state
	}
	return problem(f)
}

// write sends the probes; a probe the kernel refuses is a lost one.
func (p *Prober) write(sends []send) {
	var buf []byte
	for _, s := range sends {
		c := p.cfg.Conns[s.path]
		buf = appendMessage(buf, s.msg, s.pad)
		if _, err := c.WriteToUDPAddrPort(buf, s.to); err != nil {
			p.log.Debug("probe not sent", "peer", s.to.Addr(), "path", s.path, "size", s.msg.size, "err", err)
		}
	}
}

// payload is the UDP payload that makes an IP packet of size bytes.
func payload(to netip.Addr, size int) int {
	hdr := 20 + 8
	if to.Is6() && !to.Is4In6() {
		hdr = 40 + 8
	}
	return max(size-hdr, msgLen)
}

// Status is every path's state, sorted by peer then path.
func (p *Prober) Status() []PathStatus {
	p.mu.Lock()
	out := make([]PathStatus, 0, len(p.paths))
	for _, ps := range p.paths {
		out = append(out, PathStatus{Peer: ps.key.vtep, Path: ps.key.path, State: ps.state, Since: ps.since,
			RTT: ps.rtt, MTU: ps.target, PathMTU: ps.pathMTU, Sent: ps.sent, Answered: ps.answered, Problem: p.problemOf(ps)})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PathStatus) int {
		return cmp.Or(a.Peer.Compare(b.Peer), cmp.Compare(a.Path, b.Path))
	})
	return out
}
