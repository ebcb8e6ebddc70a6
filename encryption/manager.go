package encryption

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// Overhead is what ESP in transport mode adds to every VXLAN packet: SPI
// and sequence number (8), the GCM IV (8), the ICV (16), pad length and
// next header (2), and up to 3 bytes of padding to a 4-byte boundary.
const Overhead = 8 + 8 + ICVBits/8 + 2 + 3

// Firewall marks outbound and guards VXLAN of encrypted VNIs.
type Firewall interface {
	// EnableVNI and DisableVNI add and remove a VNI; with none left, the
	// rules go.
	EnableVNI(vni uint32) error
	DisableVNI(vni uint32) error
	// Repair restores rules changed from outside; the xfrm policies match
	// only marked packets, so lost rules would let traffic leave in clear.
	Repair() error
	// Keep takes over the rules a previous run left, as they are, and
	// returns the VNIs they cover.
	Keep() ([]uint32, error)
	// Counters reads the rules' packet counters (see FirewallCounters).
	// Plain numbers, so that the firewall package needs nothing of this
	// one.
	Counters() (marked, plaintextDropped, unprotectedDropped uint64, err error)
}

// FirewallCounters are packets of encrypted VNIs the firewall rules saw
// since the rules were last built.
type FirewallCounters struct {
	// Marked went out marked for IPsec.
	Marked uint64 `json:"marked"`
	// PlaintextDropped came in without IPsec and were dropped.
	PlaintextDropped uint64 `json:"plaintextDropped"`
	// UnprotectedDropped were on their way out with no IPsec policy to take
	// them (its state lost, or not yet programmed) and were dropped.
	UnprotectedDropped uint64 `json:"unprotectedDropped"`
}

// Config builds a Manager.
type Config struct {
	XFRM     XFRM
	Firewall Firewall
	// Salts are the cluster secrets that salt the keys, primary first
	// (SetSalts changes them).
	Salts []Salt
	// Local is this host's VTEP address; Port the VXLAN port.
	Local    netip.Addr
	Port     uint16
	Schedule Schedule
	// Publish hands this node's current public keys to the control plane.
	// Called with the encryption mutex held: its locks must sit below it.
	Publish func([]PublicKey)
	Now     func() time.Time
	Logger  *slog.Logger
	// Resume is this node's public keys as the previous run on this host,
	// with the same Local address, last published them. When set, and the
	// kernel can encrypt, the SAs and policies that run left are taken
	// over, not removed, so that the encrypted sandboxes kept across the
	// restart carry traffic throughout (see ResumeKeyring).
	Resume []PublicKey
}

// Linger is how long the SAs towards a host stay after its last reference
// went, so that a reference coming back (a container restarted on either
// side) reuses them. An outbound SA installed again counts its sequence
// numbers from 1, and a peer that never saw the reference go kept the
// inbound SA with its anti-replay window, which drops all of those. Linger
// outlasts the gossip that tells the peer (a broadcast, or at worst a
// push/pull every 10 s): a peer that waited longer has dropped its side.
const Linger = 20 * time.Second

// remote is what is programmed towards one remote host.
type remote struct {
	// sas are the installed SAs by SPI, both directions.
	sas map[uint32]Direction
	// policy is the outbound SPI in the policy; 0 for a blocking policy.
	policy    uint32
	hasPolicy bool
	// idleSince is when the last reference went; zero while referenced.
	idleSince time.Time
	// inherited are the SAs, by SPI, and inheritedPolicy says whether the
	// policy, that the previous run left and this one took over. They are
	// kept as they are while the key ring holds an inherited generation.
	inherited       map[uint32]bool
	inheritedPolicy bool
}

func newRemote() *remote { return &remote{sas: map[uint32]Direction{}, inherited: map[uint32]bool{}} }

// Manager owns all IPsec state.
type Manager struct {
	xfrm    XFRM
	fw      Firewall
	local   netip.Addr
	port    uint16
	publish func([]PublicKey)
	now     func() time.Time
	log     *slog.Logger
	// unsupported is why this kernel cannot encrypt; nil if it can.
	unsupported error
	// resumed says that the previous run's state was taken over.
	resumed bool

	// mu is the encryption mutex of the design: it guards the key ring, the
	// peers' public keys, the refcounts and everything below, and every
	// xfrm and firewall call is made under it, so a key change never
	// interleaves with programming a peer. Lock order: network.mu → mu →
	// driver.mu; the control plane's lock (taken by Publish) sits below it.
	mu       lockrank.Mutex[lockrank.Encryption]
	keyring  *Keyring
	peerKeys map[netip.Addr][]PublicKey
	// salts are this host's cluster secrets, primary first; saltOf the
	// same by id. peerSecrets are the ids each remote host said it holds
	// (SetPeerSecrets); a host absent has said none (PairSecret).
	salts       []Salt
	saltOf      map[string][]byte
	peerSecrets map[netip.Addr][]string
	// unshared are the remotes in use that share no secret with this
	// host, and unsharedSeen counts each time one became so.
	unshared     map[netip.Addr]bool
	unsharedSeen uint64
	// refs counts, per remote VTEP, the encrypted networks that reach it.
	refs countmap.Map[netip.Addr]
	// vnis counts the users of each encrypted VNI's firewall rules.
	vnis    countmap.Map[uint32]
	remotes map[netip.Addr]*remote
	// derived caches key material per direction; entries go with their
	// generations.
	derived map[Direction]SA
	// spent are outbound directions whose SA was removed from outside:
	// installed again, it would number from 1 into the receiver's replay
	// window. Their traffic is blocked until a newer generation takes
	// over; entries go with their generations.
	spent   map[Direction]bool
	lastErr error
	// inheritedVNIs are the VNIs the previous run's firewall rules cover,
	// kept so that its sandboxes, if adopted, never go unguarded; those no
	// sandbox claims (EnableVNI) go once nothing inherited is left.
	inheritedVNIs []uint32
}

// NewManager probes the kernel and starts the first key generation. A
// kernel without ESP gives a Manager whose Supported reports why, so the
// plugin still serves unencrypted networks.
func NewManager(cfg Config) (*Manager, error) {
	if err := checkSalts(cfg.Salts); err != nil {
		return nil, err
	}
	if cfg.XFRM == nil || cfg.Firewall == nil || !cfg.Local.IsValid() || cfg.Port == 0 {
		return nil, errors.New("encryption: XFRM, Firewall, Local and Port are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Publish == nil {
		cfg.Publish = func([]PublicKey) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{
		xfrm: cfg.XFRM, fw: cfg.Firewall,
		peerSecrets: map[netip.Addr][]string{}, unshared: map[netip.Addr]bool{},
		local: cfg.Local.Unmap(), port: cfg.Port, publish: cfg.Publish, now: cfg.Now, log: cfg.Logger,
		peerKeys: map[netip.Addr][]PublicKey{}, refs: countmap.Map[netip.Addr]{},
		vnis: countmap.Map[uint32]{}, remotes: map[netip.Addr]*remote{}, derived: map[Direction]SA{}, spent: map[Direction]bool{},
	}
	m.setSalts(cfg.Salts)
	inherited, err := m.fw.Keep()
	if err != nil {
		return nil, fmt.Errorf("encryption: the previous run's firewall rules: %w", err)
	}
	m.inheritedVNIs = inherited
	m.unsupported = m.xfrm.Check()
	if m.unsupported != nil {
		m.log.Warn("encrypted networks unavailable", "err", m.unsupported)
	} else if !ErasesTemporaries {
		m.log.Warn("built without runtimesecret", "why", "copies of retired IPsec keys may stay in memory, weakening forward secrecy", "hint", "build with make (GOEXPERIMENT=runtimesecret)")
	}
	if len(cfg.Resume) > 0 && m.unsupported == nil {
		if err := m.takeOver(cfg.Schedule, cfg.Resume); err != nil {
			m.log.Warn("previous IPsec state not taken over", "why", "removing it", "err", err)
		}
	}
	if !m.resumed {
		kr, err := NewKeyring(cfg.Schedule, cfg.Now())
		if err != nil {
			return nil, err
		}
		m.keyring = kr
		clear(m.remotes)
		// The firewall rules stay until the first tick: should a sandbox
		// of the previous run still exist, its traffic meets the guard.
		if err := m.xfrm.Flush(); err != nil {
			return nil, fmt.Errorf("encryption: remove xfrm state of a previous run: %w", err)
		}
	}
	m.mu.Lock()
	m.publish(m.keyring.Public())
	m.mu.Unlock()
	return m, nil
}

// takeOver adopts the SAs and policies the previous run left towards each
// remote host, and resumes its key generations. Anything not between this
// host and another goes. Called by NewManager, before any other goroutine
// sees m.
func (m *Manager) takeOver(s Schedule, keys []PublicKey) error {
	kr, err := ResumeKeyring(s, keys)
	if err != nil {
		return err
	}
	states, pols, err := m.installed()
	if err != nil {
		return err
	}
	of := func(vtep netip.Addr) *remote {
		r := m.remotes[vtep]
		if r == nil {
			r = newRemote()
			m.remotes[vtep] = r
		}
		return r
	}
	var errs []error
	for _, st := range states {
		switch m.local {
		case st.Src:
			of(st.Dst).sas[st.SPI] = Direction{Src: st.Src, Dst: st.Dst}
			of(st.Dst).inherited[st.SPI] = true
		case st.Dst:
			of(st.Src).sas[st.SPI] = Direction{Src: st.Src, Dst: st.Dst}
			of(st.Src).inherited[st.SPI] = true
		default:
			errs = append(errs, m.xfrm.DeleteSA(st.Src, st.Dst, st.SPI))
		}
	}
	for _, p := range pols {
		if p.Src != m.local || p.Port != m.port {
			errs = append(errs, m.xfrm.DeletePolicy(p.Src, p.Dst, p.Port))
			continue
		}
		r := of(p.Dst)
		r.policy, r.hasPolicy, r.inheritedPolicy = p.SPI, true, true
	}
	if err := errors.Join(errs...); err != nil {
		clear(m.remotes)
		return err
	}
	m.keyring, m.resumed = kr, true
	m.log.Info("took over the previous run's IPsec state", "remotes", len(m.remotes), "sas", len(states), "policies", len(pols))
	return nil
}

// installed reads back the SAs and policies of ours the kernel holds.
func (m *Manager) installed() ([]StateInfo, []PolicyInfo, error) {
	states, err := m.xfrm.States()
	if err != nil {
		return nil, nil, err
	}
	pols, err := m.xfrm.Policies()
	return states, pols, err
}

// Supported reports why encrypted networks cannot work here, or nil.
func (m *Manager) Supported() error { return m.unsupported }

// Overhead is what ESP adds to every packet (see the constant), for the
// driver's MTU.
func (m *Manager) Overhead() int { return Overhead }

// Resumed reports whether the previous run's IPsec state was taken over,
// so that its encrypted sandboxes may be kept.
func (m *Manager) Resumed() bool { return m.resumed }

// Inherited says whether the previous run's firewall rules, taken over at
// start, guard vni: a sandbox adopted without a record of its network was
// then an encrypted network's.
func (m *Manager) Inherited(vni uint32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.inheritedVNIs, vni)
}

// EnableVNI starts encrypting a VNI used by a local sandbox.
func (m *Manager) EnableVNI(vni uint32) error {
	if m.unsupported != nil {
		return m.unsupported
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vnis[vni] == 0 {
		if err := m.fw.EnableVNI(vni); err != nil {
			return fmt.Errorf("firewall rules for encrypted VNI %d: %w", vni, err)
		}
	}
	m.vnis.Add(vni, 1)
	return nil
}

// DisableVNI undoes EnableVNI.
func (m *Manager) DisableVNI(vni uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vnis[vni] == 0 {
		return nil
	}
	if m.vnis[vni] == 1 {
		if err := m.fw.DisableVNI(vni); err != nil {
			return fmt.Errorf("remove firewall rules of VNI %d: %w", vni, err)
		}
	}
	m.vnis.Add(vni, -1)
	return nil
}

// AddRemote takes a reference on the IPsec state towards vtep; the first
// reference programs it. Traffic to a host whose keys are not known yet is
// blocked, never sent in clear.
func (m *Manager) AddRemote(vtep netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	vtep = vtep.Unmap()
	if m.refs.Add(vtep, 1) > 1 {
		return nil
	}
	return m.reconcile(vtep)
}

// RemoveRemote drops a reference; the last one removes the host's SAs and
// policy.
func (m *Manager) RemoveRemote(vtep netip.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	vtep = vtep.Unmap()
	if _, ok := m.refs[vtep]; !ok {
		return nil
	}
	if m.refs.Add(vtep, -1) > 0 {
		return nil
	}
	return m.reconcile(vtep)
}

// SetPeerKeys records the public keys a host published (a copy is kept)
// and reprograms it if it is in use.
func (m *Manager) SetPeerKeys(vtep netip.Addr, keys []PublicKey) error {
	cp := make([]PublicKey, len(keys))
	for i, k := range keys {
		cp[i] = k
		cp[i].Key = append([]byte(nil), k.Key...)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	vtep = vtep.Unmap()
	if len(cp) == 0 {
		delete(m.peerKeys, vtep)
	} else {
		m.peerKeys[vtep] = cp
	}
	var errRotate error
	if len(cp) > 0 && m.keyring.Resuming() {
		// The first peer reached this resumed run and gets our keys in the
		// same exchange: our own generation starts now, so that it
		// activates once every peer had Lead to install inbound SAs for
		// it. No other peer's keys are known yet.
		if errRotate = m.keyring.ForceRotate(m.now()); errRotate == nil {
			m.log.Info("resumed run reached", "why", "a peer reached this resumed run: new key generation", "from", vtep, "activates in", m.keyring.sched.Lead)
			m.publish(m.keyring.Public())
		}
	}
	err := m.reconcile(vtep)
	m.prune()
	return errors.Join(errRotate, err)
}

// Tick advances the key schedule and reprograms every host in use: new
// generations get inbound SAs, activated ones take over outbound traffic,
// retired ones go.
func (m *Manager) Tick() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed, err := m.keyring.Tick(m.now())
	if err != nil {
		return err
	}
	if len(m.inheritedVNIs) > 0 && !m.keyring.Inherited() {
		var keep []uint32
		for _, vni := range m.inheritedVNIs {
			if m.vnis[vni] > 0 {
				continue
			}
			if err := m.fw.DisableVNI(vni); err != nil {
				m.log.Warn("remove the previous run's firewall rules", "vni", vni, "err", err)
				keep = append(keep, vni)
			}
		}
		m.inheritedVNIs = keep
	}
	if len(m.vnis) > 0 {
		if err := m.fw.Repair(); err != nil {
			m.log.Warn("repair firewall rules", "err", err)
		}
	}
	if changed {
		m.publish(m.keyring.Public())
	}
	if len(m.remotes) > 0 {
		if err := m.forgetLost(); err != nil {
			m.log.Warn("read back IPsec state", "err", err)
		}
	}
	return m.reconcileAll()
}

// forgetLost drops from m.remotes the SAs and policies the kernel no
// longer holds (an `ip xfrm state flush` from outside, say), so that the
// reconcile that follows programs them again; meanwhile the firewall's
// guard drops the traffic they carried. An inbound SA or a policy comes
// back as it was. A lost outbound SA cannot: installed again, it would
// count its sequence numbers from 1, and the receiver's anti-replay
// window, which has seen those, would drop everything it sends. So it is
// spent: its traffic is blocked, and a new generation starts, whose fresh
// SAs take over after Lead. Caller holds mu.
func (m *Manager) forgetLost() error {
	states, pols, err := m.installed()
	if err != nil {
		return err
	}
	type stateKey struct {
		dst netip.Addr
		spi uint32
	}
	haveSA := map[stateKey]bool{}
	for _, st := range states {
		haveSA[stateKey{st.Dst, st.SPI}] = true
	}
	havePolicy := map[netip.Addr]uint32{}
	for _, p := range pols {
		if p.Src == m.local && p.Port == m.port {
			havePolicy[p.Dst] = p.SPI
		}
	}
	lostOut := false
	for vtep, r := range m.remotes {
		for spi, d := range r.sas {
			if !haveSA[stateKey{d.Dst, spi}] {
				m.log.Warn("IPsec SA removed outside", "why", "programming it again", "remote", vtep, "sa", d, "spi", spi)
				delete(r.sas, spi)
				if d.Src == m.local {
					m.spent[d], lostOut = true, true
				}
			}
		}
		if spi, ok := havePolicy[vtep]; r.hasPolicy && (!ok || spi != r.policy) {
			m.log.Warn("IPsec policy changed outside", "why", "programming it again", "remote", vtep)
			r.hasPolicy = false
		}
	}
	if !lostOut {
		return nil
	}
	m.log.Warn("outbound IPsec SA removed outside", "why", "starting a new key generation; traffic resumes when it activates", "after", m.keyring.sched.Lead)
	if err := m.keyring.ForceRotate(m.now()); err != nil {
		return err
	}
	m.publish(m.keyring.Public())
	return nil
}

// Rotate starts a new generation now, outside the schedule.
func (m *Manager) Rotate() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.keyring.ForceRotate(m.now()); err != nil {
		return err
	}
	m.publish(m.keyring.Public())
	return m.reconcileAll()
}

// Run ticks every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.Tick(); err != nil {
				m.log.Warn("encryption tick", "err", err)
			}
		}
	}
}

// Detach stops managing without touching the kernel, for a stop: the SAs,
// policies and firewall table stay, so the encrypted sandboxes kept across
// a restart go on carrying traffic (never in clear: the firewall's guard
// drops what no policy takes), and the next run takes them over (Resume).
// Key material in memory is wiped.
func (m *Manager) Detach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sa := range m.derived {
		clear(sa.Key)
	}
	clear(m.derived)
	for _, g := range m.keyring.gens {
		clear(g.priv)
	}
	clear(m.remotes)
	clear(m.refs)
	clear(m.vnis)
}

func (m *Manager) reconcileAll() error {
	var errs []error
	for _, vtep := range slices.Collect(maps.Keys(m.remotes)) {
		errs = append(errs, m.reconcile(vtep))
	}
	for vtep := range m.refs {
		if _, done := m.remotes[vtep]; !done {
			errs = append(errs, m.reconcile(vtep))
		}
	}
	m.prune()
	return errors.Join(errs...)
}

// reconcile makes the kernel's SAs and policy towards vtep what the keys
// and refcounts imply: new SAs first, then the policy switches, then stale
// SAs go, so no packet ever meets a missing SA. Caller holds mu.
func (m *Manager) reconcile(vtep netip.Addr) error {
	if m.unsupported != nil {
		return nil
	}
	r := m.remotes[vtep]
	if r == nil {
		r = newRemote()
	}
	// While an inherited generation lives, what the previous run left
	// stays: it carries the traffic this run cannot derive keys for.
	held := m.keyring.Inherited()
	now := m.now()
	if m.refs[vtep] > 0 {
		r.idleSince = time.Time{}
	} else if r.idleSince.IsZero() {
		r.idleSince = now
	}
	lingering := m.refs[vtep] == 0 && now.Sub(r.idleSince) < Linger
	want := map[uint32]SA{}
	var out SA
	hasOut := false
	var errs []error
	if m.refs[vtep] > 0 {
		own := m.keyring.Public()
		peer := m.peerKeys[vtep]
		for _, pk := range peer {
			for _, g := range own {
				// Every secret this host holds: the peer may send with
				// any it holds too (PairSecret).
				for _, s := range m.salts {
					sa, err := m.sa(Direction{Src: vtep, Dst: m.local, SrcGen: pk.Gen, DstGen: g.Gen, Secret: s.ID}, g.Gen, pk.Key)
					if errors.Is(err, errNoPrivateKey) {
						continue // the kernel holds it if it was ever needed
					}
					if err != nil {
						errs = append(errs, err)
						continue
					}
					want[sa.SPI] = sa
				}
			}
		}
		a, okA := Active(own, now)
		b, okB := Active(peer, now)
		if okA && okB && b.Inherited {
			// The peer restarted and receives with b only on the SAs its
			// previous run installed, which pair b with our generations
			// of that time: any other would meet no inbound SA. Keep the
			// SA in use while both ends still have it; without one, block
			// until the peer's own generation activates.
			kept := false
			if d, ok := r.sas[r.policy]; r.hasPolicy && ok && d.DstGen == b.Gen {
				if i := slices.IndexFunc(own, func(g PublicKey) bool { return g.Gen == d.SrcGen }); i >= 0 {
					a, kept = own[i], true
				}
			}
			okB = kept
		}
		secret, shared := m.pairSecret(vtep)
		if okA && okB && shared {
			sa, err := m.sa(Direction{Src: m.local, Dst: vtep, SrcGen: a.Gen, DstGen: b.Gen, Secret: secret}, a.Gen, b.Key)
			switch {
			case errors.Is(err, errNoPrivateKey):
				// Sending with an inherited generation: the policy the
				// previous run left does, or traffic waits.
			case err != nil:
				errs = append(errs, err)
			case m.spent[sa.Direction]:
				// Blocked until the generation forgetLost started.
			default:
				want[sa.SPI], out, hasOut = sa, sa, true
			}
		}
	}
	for spi, sa := range want {
		if _, ok := r.sas[spi]; ok {
			continue
		}
		if err := m.xfrm.AddSA(sa); err != nil {
			errs = append(errs, fmt.Errorf("add SA %s: %w", sa.Direction, err))
			delete(want, spi)
			if hasOut && spi == out.SPI {
				hasOut = false
			}
			continue
		}
		r.sas[spi] = sa.Direction
	}
	switch {
	case held && r.inheritedPolicy && !hasOut:
	case m.refs[vtep] == 0:
		if r.hasPolicy {
			if err := m.xfrm.DeletePolicy(m.local, vtep, m.port); err != nil {
				errs = append(errs, err)
			} else {
				r.policy, r.hasPolicy, r.inheritedPolicy = 0, false, false
			}
		}
	case hasOut && (!r.hasPolicy || r.policy != out.SPI):
		if err := m.xfrm.SetPolicy(m.local, vtep, m.port, out.SPI); err != nil {
			errs = append(errs, err)
		} else {
			r.policy, r.hasPolicy, r.inheritedPolicy = out.SPI, true, false
		}
	case !hasOut && (!r.hasPolicy || r.policy != 0):
		if err := m.xfrm.BlockPolicy(m.local, vtep, m.port); err != nil {
			errs = append(errs, err)
		} else {
			r.policy, r.hasPolicy, r.inheritedPolicy = 0, true, false
		}
	}
	for spi, d := range r.sas {
		if _, ok := want[spi]; ok || (r.hasPolicy && spi == r.policy) || (held && r.inherited[spi]) || lingering {
			continue
		}
		if err := m.xfrm.DeleteSA(d.Src, d.Dst, spi); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.sas, spi)
		delete(r.inherited, spi)
	}
	if len(r.sas) == 0 && !r.hasPolicy {
		delete(m.remotes, vtep)
	} else {
		m.remotes[vtep] = r
	}
	err := errors.Join(errs...)
	if err != nil {
		m.lastErr = err
		m.log.Warn("program IPsec", "remote", vtep, "err", err)
	}
	return err
}

// sa returns the key material of d, computing it once per direction. own is
// our generation in d, peerKey the other end's public key.
func (m *Manager) sa(d Direction, own uint64, peerKey []byte) (SA, error) {
	if sa, ok := m.derived[d]; ok {
		return sa, nil
	}
	// In secret too: HKDF's state would let anyone who finds it on the
	// stack recompute this SA's key after the generation retired.
	var sa SA
	var err error
	inSecret(func() {
		var shared []byte
		if shared, err = m.keyring.Shared(own, peerKey); err == nil {
			if salt, ok := m.saltOf[d.Secret]; ok {
				sa, err = DeriveSA(shared, salt, d)
			} else {
				err = fmt.Errorf("cluster secret %s: not held", d.Secret)
			}
			clear(shared)
		}
	})
	if err != nil {
		return SA{}, err
	}
	m.derived[d] = sa
	return sa, nil
}

// prune forgets derived keys and spent directions whose generations are
// gone on either side.
func (m *Manager) prune() {
	own := map[uint64]bool{}
	for _, g := range m.keyring.Public() {
		own[g.Gen] = true
	}
	for d, sa := range m.derived {
		ours, theirs := d.SrcGen, d.DstGen
		peer := d.Dst
		if d.Dst == m.local {
			ours, theirs, peer = d.DstGen, d.SrcGen, d.Src
		}
		_, held := m.saltOf[d.Secret]
		if !held || !own[ours] || !slices.ContainsFunc(m.peerKeys[peer], func(k PublicKey) bool { return k.Gen == theirs }) {
			clear(sa.Key)
			delete(m.derived, d)
		}
	}
	for d := range m.spent {
		if _, held := m.saltOf[d.Secret]; !held || !own[d.SrcGen] || !slices.ContainsFunc(m.peerKeys[d.Dst], func(k PublicKey) bool { return k.Gen == d.DstGen }) {
			delete(m.spent, d)
		}
	}
}

// Status is a copy of the IPsec state, for inspection.
type Status struct {
	Supported string          `json:"unsupported,omitempty"`
	Own       []PublicKeyInfo `json:"ownGenerations"`
	Remotes   []RemoteStatus  `json:"remotes"`
	VNIs      []uint32        `json:"encryptedVNIs"`
	// Secrets are the ids of this host's cluster secrets, primary first;
	// Unshared counts the times a host in use was found to share none.
	Secrets   []string         `json:"secrets"`
	Unshared  uint64           `json:"unsharedSecretRefusals"`
	States    []StateInfo      `json:"states"`
	Firewall  FirewallCounters `json:"firewall"`
	LastError string           `json:"lastError,omitempty"`
}

// PublicKeyInfo is a generation without its key bytes.
type PublicKeyInfo struct {
	Gen        uint64    `json:"gen"`
	ActivateAt time.Time `json:"activateAt"`
	Inherited  bool      `json:"inherited,omitempty"`
}

// RemoteStatus is what is known and programmed towards one host.
type RemoteStatus struct {
	VTEP        netip.Addr      `json:"vtep"`
	Refs        int             `json:"refs"`
	Generations []PublicKeyInfo `json:"generations"`
	PolicySPI   uint32          `json:"policySPI"`
	Blocked     bool            `json:"blocked"`
	SAs         int             `json:"sas"`
	// Secrets are the ids of the cluster secrets it said it holds
	// (none: it said none), and Secret the one this host sends to it
	// with, if its policy carries an SA.
	Secrets []string `json:"secrets,omitempty"`
	Secret  string   `json:"secret,omitempty"`
}

func infos(keys []PublicKey) []PublicKeyInfo {
	out := make([]PublicKeyInfo, len(keys))
	for i, k := range keys {
		out[i] = PublicKeyInfo{Gen: k.Gen, ActivateAt: k.ActivateAt, Inherited: k.Inherited}
	}
	return out
}

// Status reports the key generations, the hosts in use and the SAs. Every
// metrics scrape calls it: the kernel is read (SAs, firewall counters)
// after the encryption mutex is released, so that no Join waits behind a
// dump (XFRM and Firewall serialise their own requests).
func (m *Manager) Status() Status {
	st := m.ownStatus()
	if states, err := m.xfrm.States(); err == nil {
		st.States = states
	}
	if marked, plain, unprotected, err := m.fw.Counters(); err == nil {
		st.Firewall = FirewallCounters{Marked: marked, PlaintextDropped: plain, UnprotectedDropped: unprotected}
	}
	return st
}

// ownStatus is the part of Status the manager holds in memory.
func (m *Manager) ownStatus() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Status{Own: infos(m.keyring.Public()), Remotes: []RemoteStatus{}, VNIs: slices.Sorted(maps.Keys(m.vnis)),
		Secrets: m.secretIDs(), Unshared: m.unsharedSeen}
	if m.unsupported != nil {
		st.Supported = m.unsupported.Error()
	}
	if m.lastErr != nil {
		st.LastError = m.lastErr.Error()
	}
	vteps := map[netip.Addr]bool{}
	for v := range m.refs {
		vteps[v] = true
	}
	for v := range m.peerKeys {
		vteps[v] = true
	}
	for _, v := range slices.SortedFunc(maps.Keys(vteps), netip.Addr.Compare) {
		rs := RemoteStatus{VTEP: v, Refs: m.refs[v], Generations: infos(m.peerKeys[v]), Secrets: slices.Clone(m.peerSecrets[v])}
		if r := m.remotes[v]; r != nil {
			rs.Blocked, rs.SAs = r.hasPolicy && r.policy == 0, len(r.sas)
			if r.hasPolicy {
				rs.PolicySPI = r.policy
				rs.Secret = r.sas[r.policy].Secret
			}
		}
		st.Remotes = append(st.Remotes, rs)
	}
	return st
}
