// Package peerdb is one network's table of endpoints, local and remote, and
// the IP → (MAC, VTEP) bindings they imply. It decides which endpoint owns
// an IP when several claim it, and reports every change of owner so the
// driver can program exactly the neighbour and FDB entries that changed.
//
// A DB is not safe for concurrent use: it is embedded in the driver's
// network and guarded by that network's lock.
package peerdb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"unique"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
)

// Peer is one endpoint of the network.
type Peer struct {
	EndpointID string `json:"endpointID"`
	// IPs are the endpoint's IPv4 and IPv6 addresses, without prefix.
	IPs []netip.Addr `json:"ips"`
	MAC hwaddr.MAC   `json:"mac"`
	// VTEP is the underlay address of the host holding the endpoint. Unset
	// for local endpoints.
	VTEP netip.Addr `json:"vtep"`
	// Local marks an endpoint on this host: it claims its IPs (so no remote
	// claimant is programmed for them) but needs no kernel entries, the
	// bridge reaches it directly.
	Local bool `json:"local,omitempty"`
}

// Clone returns a deep copy, so a Peer can cross goroutines safely.
func (p Peer) Clone() Peer {
	p.IPs = slices.Clone(p.IPs)
	return p
}

// idByte says which bytes an id may hold: ASCII letters and digits.
var idByte = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	return t
}()

// CheckID is the one rule for network and endpoint ids, on every path
// (Docker's API, gossip, the admin API): 1 to 128 letters and digits, as
// Docker's ids are. What may be added may thus always be deleted.
func CheckID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("empty %s id", kind)
	}
	if len(id) > 128 {
		return fmt.Errorf("%s id longer than 128 characters", kind)
	}
	// By byte, not by rune, and by table: every record from the network
	// is checked on its way (cluster, driver, peer db). Any byte of a
	// multi-byte character fails the test as the rune would.
	for i := 0; i < len(id); i++ {
		if !idByte[id[i]] {
			return fmt.Errorf("%s id %q has a character other than a letter or digit", kind, id)
		}
	}
	return nil
}

// Validate reports a peer that cannot be stored.
func (p Peer) Validate() error {
	if err := CheckID("endpoint", p.EndpointID); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	if len(p.IPs) == 0 {
		return fmt.Errorf("peer %s: no IP address", p.EndpointID)
	}
	for _, ip := range p.IPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.Zone() != "" {
			return fmt.Errorf("peer %s: unusable IP address %v", p.EndpointID, ip)
		}
	}
	if p.MAC.IsZero() || p.MAC[0]&1 == 1 {
		return fmt.Errorf("peer %s: MAC %s is not a unicast address", p.EndpointID, p.MAC)
	}
	if !p.Local && (!p.VTEP.IsValid() || p.VTEP.IsUnspecified() || p.VTEP.IsMulticast() || p.VTEP.Zone() != "") {
		return fmt.Errorf("peer %s: remote peer needs a unicast VTEP address, got %v", p.EndpointID, p.VTEP)
	}
	return nil
}

// Binding is what one IP resolves to: the endpoint that owns it.
type Binding struct {
	EndpointID string
	MAC        hwaddr.MAC
	VTEP       netip.Addr
	Local      bool
}

// Change is a change of owner of one IP. Old or New is nil where the IP had
// or has no owner.
type Change struct {
	IP       netip.Addr
	Old, New *Binding
}

// DB is the peer table of one network. The zero value is empty and ready.
//
// It is laid out for networks of many endpoints with one IP each, whose
// IPs nobody else claims: an entry holds its peer's first IP inline, and
// claims its first claimant; the rare further IPs and claimants wait in
// overflow maps.
type DB struct {
	peers  map[string]entry
	more   map[string][]netip.Addr // a peer's IPs after entry.ip, if it has several
	claims claims                  // the first endpoint id claiming each IP
	rivals map[netip.Addr][]string // the others claiming it, unordered
}

// entry is a stored peer, its endpoint id being its key in peers.
type entry struct {
	ip    addr16 // the smallest of its IPs
	vtep  unique.Handle[netip.Addr]
	mac   hwaddr.MAC
	local bool
	multi bool // more IPs in DB.more
}

// addr16 is an IP in 16 bytes where a netip.Addr takes 24 (its zone
// pointer). The DB stores IPs unmapped and without zone, which As16 keeps
// apart: unpack gives back the stored IP.
type addr16 [16]byte

func (a addr16) unpack() netip.Addr { return netip.AddrFrom16(a).Unmap() }

// claims maps the IPs the DB stores (unmapped, without zone) to their
// first claimant; an IPv4 key takes 4 bytes, an IPv6 one 16.
type claims struct {
	v4 map[[4]byte]string
	v6 map[addr16]string
}

// get finds ip's first claimant; an IP with a zone has none.
func (c *claims) get(ip netip.Addr) (string, bool) {
	var id string
	var ok bool
	switch {
	case ip.Is4():
		id, ok = c.v4[ip.As4()]
	case ip.Zone() == "":
		// An IPv4-mapped address is not found: IPv4 is stored as such.
		id, ok = c.v6[ip.As16()]
	}
	return id, ok
}

func (c *claims) set(ip netip.Addr, id string) {
	if ip.Is4() {
		if c.v4 == nil {
			c.v4 = map[[4]byte]string{}
		}
		c.v4[ip.As4()] = id
		return
	}
	if c.v6 == nil {
		c.v6 = map[addr16]string{}
	}
	c.v6[ip.As16()] = id
}

func (c *claims) delete(ip netip.Addr) {
	if ip.Is4() {
		delete(c.v4, ip.As4())
	} else {
		delete(c.v6, ip.As16())
	}
}

func (c *claims) len() int { return len(c.v4) + len(c.v6) }

// ips yields every claimed IP.
func (c *claims) ips(yield func(netip.Addr) bool) {
	for k := range c.v4 {
		if !yield(netip.AddrFrom4(k)) {
			return
		}
	}
	for k := range c.v6 {
		if !yield(k.unpack()) {
			return
		}
	}
}

// Add stores p, replacing any peer with the same endpoint id, and returns
// the ownership changes it causes. An invalid peer changes nothing.
func (db *DB) Add(p Peer) ([]Change, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	ips := make([]netip.Addr, len(p.IPs))
	for i, ip := range p.IPs {
		ips[i] = ip.Unmap()
	}
	ips = dedup(ips)
	vtep := p.VTEP.Unmap()
	if p.Local {
		vtep = netip.Addr{}
	}
	e := entry{ip: addr16(ips[0].As16()), vtep: unique.Make(vtep), mac: p.MAC, local: p.Local, multi: len(ips) > 1}
	if db.peers == nil {
		db.peers = map[string]entry{}
	}
	old, had := db.Get(p.EndpointID)
	touched := ips
	if had {
		touched = dedup(append(slices.Clone(ips), old.IPs...))
	}
	before := db.winners(touched)
	if had {
		db.unclaim(old)
	}
	db.peers[p.EndpointID] = e
	if e.multi {
		if db.more == nil {
			db.more = map[string][]netip.Addr{}
		}
		db.more[p.EndpointID] = ips[1:]
	}
	for _, ip := range ips {
		db.claim(ip, p.EndpointID)
	}
	return db.diff(touched, before), nil
}

// Delete removes the endpoint and returns the ownership changes. Deleting an
// unknown endpoint changes nothing.
func (db *DB) Delete(endpointID string) []Change {
	old, had := db.Get(endpointID)
	if !had {
		return nil
	}
	before := db.winners(old.IPs)
	db.unclaim(old)
	delete(db.peers, endpointID)
	return db.diff(old.IPs, before)
}

// Get returns a copy of the endpoint's peer.
func (db *DB) Get(endpointID string) (Peer, bool) {
	e, ok := db.peers[endpointID]
	if !ok {
		return Peer{}, false
	}
	return db.peer(endpointID, e), true
}

// peer rebuilds the Peer of a stored entry, in new memory.
func (db *DB) peer(id string, e entry) Peer {
	ips := []netip.Addr{e.ip.unpack()}
	if e.multi {
		ips = append(ips, db.more[id]...)
	}
	return Peer{EndpointID: id, IPs: ips, MAC: e.mac, VTEP: e.vtep.Value(), Local: e.local}
}

// Len is the number of peers.
func (db *DB) Len() int { return len(db.peers) }

// RemoteCount is the number of remote peers.
func (db *DB) RemoteCount() int {
	n := 0
	for _, e := range db.peers {
		if !e.local {
			n++
		}
	}
	return n
}

// Peers returns copies of all peers, sorted by endpoint id.
func (db *DB) Peers() []Peer {
	out := make([]Peer, 0, len(db.peers))
	for id, e := range db.peers {
		out = append(out, db.peer(id, e))
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(a.EndpointID, b.EndpointID) })
	return out
}

// WithMAC returns copies of the peers with MAC mac, sorted by endpoint
// id (usually none or one). It scans
// without copying the others: CreateEndpoint asks it of every new
// endpoint, and Peers' copy and sort of 10,000 peers each time cost
// two fifths of a 100-host rollout's CPU.
func (db *DB) WithMAC(mac hwaddr.MAC) []Peer {
	var out []Peer
	for id, e := range db.peers {
		if e.mac == mac {
			out = append(out, db.peer(id, e))
		}
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(a.EndpointID, b.EndpointID) })
	return out
}

// Bindings returns the owner of every claimed IP: the desired state.
func (db *DB) Bindings() map[netip.Addr]Binding {
	out := make(map[netip.Addr]Binding, db.claims.len())
	for ip := range db.claims.ips {
		if b, ok := db.winner(ip); ok {
			out[ip] = b
		}
	}
	return out
}

// Owner returns the binding that owns ip.
func (db *DB) Owner(ip netip.Addr) (Binding, bool) { return db.winner(ip) }

// winner applies the ownership rule: a local claimant beats any remote one
// (this host knows its own endpoint is live; a remote claim may be a stale
// record whose delete has not arrived yet), and among claimants of the same
// kind the smallest endpoint id wins, so every host picks the same remote
// owner whatever order the records arrived in.
func (db *DB) winner(ip netip.Addr) (Binding, bool) {
	first, ok := db.claims.get(ip)
	if !ok {
		return Binding{}, false
	}
	best, e := first, db.peers[first]
	for _, id := range db.rivals[ip] {
		p := db.peers[id]
		if (p.local && !e.local) || (p.local == e.local && id < best) {
			best, e = id, p
		}
	}
	return Binding{EndpointID: best, MAC: e.mac, VTEP: e.vtep.Value(), Local: e.local}, true
}

func (db *DB) winners(ips []netip.Addr) map[netip.Addr]Binding {
	m := make(map[netip.Addr]Binding, len(ips))
	for _, ip := range ips {
		if b, ok := db.winner(ip); ok {
			m[ip] = b
		}
	}
	return m
}

func (db *DB) diff(ips []netip.Addr, before map[netip.Addr]Binding) []Change {
	var out []Change
	for _, ip := range ips {
		o, hadOld := before[ip]
		n, hasNew := db.winner(ip)
		if hadOld == hasNew && o == n {
			continue
		}
		c := Change{IP: ip}
		if hadOld {
			c.Old = &o
		}
		if hasNew {
			c.New = &n
		}
		out = append(out, c)
	}
	return out
}

// claim adds id to the claimants of ip.
func (db *DB) claim(ip netip.Addr, id string) {
	if _, taken := db.claims.get(ip); !taken {
		db.claims.set(ip, id)
		return
	}
	if db.rivals == nil {
		db.rivals = map[netip.Addr][]string{}
	}
	db.rivals[ip] = append(db.rivals[ip], id)
}

// unclaim takes p's claims back, and its further IPs.
func (db *DB) unclaim(p Peer) {
	for _, ip := range p.IPs {
		rivals := db.rivals[ip]
		if first, _ := db.claims.get(ip); first == p.EndpointID {
			if len(rivals) == 0 {
				db.claims.delete(ip)
				continue
			}
			// The last rival becomes the first claimant.
			db.claims.set(ip, rivals[len(rivals)-1])
			rivals = slices.Delete(rivals, len(rivals)-1, len(rivals))
		} else {
			rivals = slices.DeleteFunc(rivals, func(id string) bool { return id == p.EndpointID })
		}
		if len(rivals) == 0 {
			delete(db.rivals, ip)
		} else {
			db.rivals[ip] = rivals
		}
	}
	delete(db.more, p.EndpointID)
}

func dedup(ips []netip.Addr) []netip.Addr {
	slices.SortFunc(ips, netip.Addr.Compare)
	return slices.Compact(ips)
}
