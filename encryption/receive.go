package encryption

import "net/netip"

// ReceiveKeys takes the public keys a host gossips (its node data, as the
// Publisher of that host encoded them; nil when it has none or left) to
// the manager: the inbound half of key distribution. It is the cluster's
// NodeData callback. What cannot be read or programmed is logged: one
// host's bad data must not stop the others'.
func (m *Manager) ReceiveKeys(vtep netip.Addr, data []byte) {
	var keys []PublicKey
	if data != nil {
		var err error
		if keys, err = DecodePublicKeys(data); err != nil {
			m.log.Warn("unreadable public keys from a node", "vtep", vtep, "err", err)
			return
		}
	}
	if err := m.SetPeerKeys(vtep, keys); err != nil {
		m.log.Warn("program IPsec for a node's keys", "vtep", vtep, "err", err)
	}
}
