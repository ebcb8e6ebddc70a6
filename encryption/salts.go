package encryption

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Salt is one cluster secret as IPsec uses it: the secret's id and the
// ESP salt derived from it.
type Salt struct {
	ID  string
	Key []byte
}

// Salts derives the ESP salts of a keyring, in its order.
func Salts(ring []Secret) []Salt {
	out := make([]Salt, len(ring))
	for i, s := range ring {
		out[i] = Salt{ID: s.ID, Key: Subkey(s.Key, UseESP)}
	}
	return out
}

func checkSalts(salts []Salt) error {
	if len(salts) == 0 || len(salts) > MaxSecrets {
		return fmt.Errorf("encryption: %d cluster secrets, want 1 to %d", len(salts), MaxSecrets)
	}
	for i, s := range salts {
		if len(s.Key) != SecretLen || s.ID == "" {
			return errors.New("encryption: a cluster secret without an id or of the wrong length")
		}
		if slices.ContainsFunc(salts[:i], func(o Salt) bool { return o.ID == s.ID }) {
			return fmt.Errorf("encryption: cluster secret %s twice", s.ID)
		}
	}
	return nil
}

// PairSecret is the secret this host sends to a peer with: the first of
// its own, primary first, that the peer holds. Every host installs inbound
// SAs for all of its secrets before it tells the others it holds them, so
// whatever a sender picks has its SA waiting at the receiver; the primary
// is the operator's choice of the newest, and a pair moves to it as soon
// as both hold it. A peer that said nothing (a 0.1.0 host, which holds one
// secret and says none, or one not heard from yet) is taken to hold this
// host's primary, as before keyrings. ok is false when they share none:
// the pair cannot talk until one of them gets a secret of the other's.
func PairSecret(own, peer []string, said bool) (id string, ok bool) {
	if len(own) == 0 {
		return "", false
	}
	if !said {
		return own[0], true
	}
	for _, id := range own {
		if slices.Contains(peer, id) {
			return id, true
		}
	}
	return "", false
}

// setSalts makes salts this host's secrets. Caller holds mu, or owns m.
func (m *Manager) setSalts(salts []Salt) {
	for _, s := range m.salts {
		clear(s.Key)
	}
	m.salts, m.saltOf = make([]Salt, len(salts)), make(map[string][]byte, len(salts))
	for i, s := range salts {
		m.salts[i] = Salt{ID: s.ID, Key: append([]byte(nil), s.Key...)}
		m.saltOf[s.ID] = m.salts[i].Key
	}
}

// SetSalts replaces this host's cluster secrets, primary first, and
// reprograms every host in use: SAs salted with a new secret are
// installed (inbound for every peer at once, so call it before the
// members are told the secret's id), a pair moves to its PairSecret, and
// SAs of a secret no longer held go. Bad salts change nothing.
func (m *Manager) SetSalts(salts []Salt) error {
	if err := checkSalts(salts); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.setSalts(salts)
	return m.reconcileAll()
}

// SetPeerSecrets records the ids of the secrets a host said it holds,
// primary first (nil: it said none), and reprograms it if it is in use.
func (m *Manager) SetPeerSecrets(vtep netip.Addr, ids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	vtep = vtep.Unmap()
	if ids == nil {
		delete(m.peerSecrets, vtep)
	} else {
		m.peerSecrets[vtep] = slices.Clone(ids)
	}
	return m.reconcile(vtep)
}

// pairSecret is PairSecret for vtep, and keeps the count of hosts in use
// that share no secret with this one. Caller holds mu.
func (m *Manager) pairSecret(vtep netip.Addr) (string, bool) {
	own := m.secretIDs()
	peer, said := m.peerSecrets[vtep]
	id, ok := PairSecret(own, peer, said)
	switch {
	case !ok && !m.unshared[vtep]:
		m.unshared[vtep] = true
		m.unsharedSeen++
		m.log.Warn("remote host refused", "remote", vtep, "why", "it holds none of this host's cluster secrets: its encrypted traffic is blocked",
			"secrets", own, "its_secrets", peer, "hint", "add a secret it holds to this host's secret file, or one of these to its")
	case ok && m.unshared[vtep]:
		delete(m.unshared, vtep)
		m.log.Info("remote host shares a cluster secret again", "remote", vtep, "secret", id)
	}
	return id, ok
}

// secretIDs are the ids of this host's secrets, primary first. Caller
// holds mu.
func (m *Manager) secretIDs() []string {
	ids := make([]string, len(m.salts))
	for i, s := range m.salts {
		ids[i] = s.ID
	}
	return ids
}

// PairSecrets is, for every remote host whose policy carries an SA, the
// id of the secret that SA is salted with. It reads no kernel state, as
// Status does.
func (m *Manager) PairSecrets() map[netip.Addr]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[netip.Addr]string{}
	for vtep, r := range m.remotes {
		if r.hasPolicy && r.policy != 0 {
			out[vtep] = r.sas[r.policy].Secret
		}
	}
	return out
}
