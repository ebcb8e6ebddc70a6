package cluster

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// Settings. Some of a node's settings must agree with every other node's
// for the data path to work: the VXLAN port, the underlay MTU the networks'
// MTU derives from (the wire versions agree through memberlist already).
// Each node tells every member that speaks wire version 3 its own, in a
// kindSettings message straight to it when it comes alive (or restarts:
// a new epoch), retried a few times; Members shows what each said, for
// the agreement check (controlplane). Nothing rides in the node meta,
// which 0.1.0 parses strictly: a 0.1.0 member neither gets nor sends one,
// and shows none.

// Settings are what a node advertises of its own settings.
type Settings struct {
	VXLANPort   uint16 `json:"vxlanPort"`
	UnderlayMTU int    `json:"underlayMTU"`
	// Swarm: VXLANPort is the swarm's data-path port, as Docker told this
	// node (a manager's engine says it) or a member that had it; a node
	// given no port of its own takes it from such a member first (ClusterPort).
	Swarm bool `json:"swarm,omitempty"`
}

const (
	// settingsTries and settingsRetry bound the sends of this node's
	// settings to a member that came alive.
	settingsTries = 3
	settingsRetry = time.Second
	// maxAdverts bounds the settings kept, by node name: whoever reaches
	// the gossip port can send some.
	maxAdverts = 4096
)

// advert is a member's settings, as the instance epoch said them, and
// the ids of the secrets it holds, primary first (none from a member
// without a secret, or of a build before keyrings).
type advert struct {
	epoch uint64
	Settings
	keyIDs []string
}

// checkSettings validates settings from the network.
func checkSettings(port, mtu, swarm uint64) (Settings, error) {
	if port == 0 || port > 65535 {
		return Settings{}, fmt.Errorf("settings: VXLAN port %d out of range", port)
	}
	if mtu < 576 || mtu > 65535 {
		return Settings{}, fmt.Errorf("settings: underlay MTU %d out of range", mtu)
	}
	if swarm > 1 {
		return Settings{}, fmt.Errorf("settings: swarm flag %d is not 0 or 1", swarm)
	}
	return Settings{VXLANPort: uint16(port), UnderlayMTU: int(mtu), Swarm: swarm == 1}, nil
}

// SettleSettings sets this node's settings, for a node that joined before
// it knew its VXLAN port (Config.Settings without one: it follows the
// members' port, which they tell): every member is told them, and refused
// or no longer refused for its port. A node that had a port keeps it.
func (c *Cluster) SettleSettings(s Settings) {
	c.mu.Lock()
	if c.settings.VXLANPort != 0 {
		c.mu.Unlock()
		return
	}
	c.settings, c.st.port = s, s.VXLANPort
	changes := map[string]int{}
	for name, m := range c.st.members {
		if m.alive {
			c.settingsDueLocked(name)
		}
		if _, said := c.st.adverts[name]; said {
			changes[name] = c.refuseLocked(name)
		}
	}
	c.mu.Unlock()
	for name, change := range changes {
		c.logRefusal(name, s.VXLANPort, change)
	}
}

// ClusterPort is the VXLAN port the live members say they use, and one
// member that said it: one following the swarm (Settings.Swarm, then
// swarm is true) before any other, the lowest by name among equals. ok is
// false while none has said one.
func (c *Cluster) ClusterPort() (port uint16, member string, swarm, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, a := range c.st.adverts {
		m := c.st.members[name]
		if m == nil || !m.alive || a.epoch != m.epoch || name == c.name {
			continue
		}
		if !ok || (a.Swarm && !swarm) || (a.Swarm == swarm && name < member) {
			port, member, swarm, ok = a.VXLANPort, name, a.Swarm, true
		}
	}
	return port, member, swarm, ok
}

// handleSettings keeps what a member said of its settings.
func (c *Cluster) handleSettings(m *message) {
	c.mu.Lock()
	if _, known := c.st.adverts[m.from]; !known && len(c.st.adverts) >= maxAdverts {
		c.mu.Unlock()
		return
	}
	c.st.adverts[m.from] = advert{epoch: m.epoch, Settings: m.adv, keyIDs: m.keyIDs}
	refused, port := c.refuseLocked(m.from), c.settings.VXLANPort
	c.keyIDsDueLocked(m.from)
	c.mu.Unlock()
	c.logRefusal(m.from, port, refused)
}

// keyIDsDueLocked marks member name's key ids due to MemberKeyIDs: it
// said them, or came alive (its settings may have come first). Caller
// holds mu.
func (c *Cluster) keyIDsDueLocked(name string) {
	if c.memberKeyIDs == nil || name == c.name {
		return
	}
	if c.keyIDsDue == nil {
		c.keyIDsDue = map[string]bool{}
	}
	c.keyIDsDue[name] = true
	c.wake(c.deliverCh)
}

// takeKeyIDsLocked empties keyIDsDue into what MemberKeyIDs gets, by
// VTEP: the ids each of those members' current instance said, copied;
// a member not alive, or whose instance said none yet, is left out.
// Caller holds mu.
func (c *Cluster) takeKeyIDsLocked() map[netip.Addr][]string {
	out := map[netip.Addr][]string{}
	for name := range c.keyIDsDue {
		m, a := c.st.members[name], c.st.adverts[name]
		if m != nil && m.alive && m.vtep.IsValid() && a.epoch == m.epoch && a.keyIDs != nil {
			out[m.vtep] = slices.Clone(a.keyIDs)
		}
	}
	c.keyIDsDue = nil
	return out
}

// refuseLocked follows whether member name is refused for receiving
// VXLAN on another port than this node's (its settings, or its instance,
// changed): on a change its endpoints are delivered again, out of the
// driver or back in. It returns +1 when it became refused, -1 when it no
// longer is, 0 otherwise. Caller holds mu.
func (c *Cluster) refuseLocked(name string) int {
	now := c.st.otherPort(name)
	if now == c.st.refused[name] {
		return 0
	}
	if now {
		c.st.refused[name] = true
	} else {
		delete(c.st.refused, name)
	}
	c.st.markOwner(name)
	c.wake(c.deliverCh)
	if now {
		return 1
	}
	return -1
}

// logRefusal says what refuseLocked found; port is this node's.
func (c *Cluster) logRefusal(name string, port uint16, change int) {
	switch change {
	case 1:
		c.log.Warn("member refused", "member", name, "this_port", port,
			"why", "it receives VXLAN on another port than this node sends to; its endpoints are not programmed here",
			"hint", "set the same --vxlan-port on every node")
	case -1:
		c.log.Info("member no longer refused", "member", name, "why", "it receives VXLAN on this node's port now")
	}
}

// settingsDueLocked marks member name due this node's settings: it came
// alive or restarted. memberlist calls its events from Create on, before
// New has the Memberlist to send with, so the sends are the loop's.
// Caller holds mu.
func (c *Cluster) settingsDueLocked(name string) {
	if c.settings.VXLANPort == 0 || name == c.name {
		return
	}
	c.settingsDue[name] = 0
	c.wake(c.settingsCh)
}

// settingsLoop sends this node's settings to the members due them, each
// straight to it, and retries a failed send settingsTries times in all.
func (c *Cluster) settingsLoop() {
	defer c.wg.Done()
	type target struct {
		name  string
		tries int
		node  *memberlist.Node
		msg   []byte
	}
	for {
		select {
		case <-c.stop:
			return
		case <-c.settingsCh:
		}
		var targets []target
		c.mu.Lock()
		for name, tries := range c.settingsDue {
			delete(c.settingsDue, name)
			m := c.st.members[name]
			if m == nil || !m.alive || !m.addr.IsValid() || m.wireOf() < kindRestartVersion || c.wireHi < kindRestartVersion {
				continue
			}
			targets = append(targets, target{name: name, tries: tries,
				node: &memberlist.Node{Name: m.name, Addr: m.addr.Addr().AsSlice(), Port: m.addr.Port()},
				msg:  encodeSettings(c.versionForLocked(name), c.name, c.epoch, c.settings, c.keyIDs)})
		}
		c.mu.Unlock()
		for _, t := range targets {
			if c.closed.Load() {
				return
			}
			err := c.ml.SendReliable(t.node, t.msg)
			if err == nil {
				c.bytesOut.Add(uint64(len(t.msg)))
				continue
			}
			if t.tries+1 >= settingsTries {
				c.log.Debug("settings not delivered", "member", t.name, "err", err)
				continue
			}
			time.AfterFunc(settingsRetry, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				if _, due := c.settingsDue[t.name]; !due {
					c.settingsDue[t.name] = t.tries + 1
				}
				c.wake(c.settingsCh)
			})
		}
	}
}
