package cluster

import (
	"fmt"
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

// advert is a member's settings, as the instance epoch said them.
type advert struct {
	epoch uint64
	Settings
}

// checkSettings validates settings from the network.
func checkSettings(port, mtu uint64) (Settings, error) {
	if port == 0 || port > 65535 {
		return Settings{}, fmt.Errorf("settings: VXLAN port %d out of range", port)
	}
	if mtu < 576 || mtu > 65535 {
		return Settings{}, fmt.Errorf("settings: underlay MTU %d out of range", mtu)
	}
	return Settings{VXLANPort: uint16(port), UnderlayMTU: int(mtu)}, nil
}

// handleSettings keeps what a member said of its settings.
func (c *Cluster) handleSettings(m *message) {
	c.mu.Lock()
	if _, known := c.st.adverts[m.from]; !known && len(c.st.adverts) >= maxAdverts {
		c.mu.Unlock()
		return
	}
	c.st.adverts[m.from] = advert{epoch: m.epoch, Settings: m.adv}
	refused := c.refuseLocked(m.from)
	c.mu.Unlock()
	c.logRefusal(m.from, refused)
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

// logRefusal says what refuseLocked found.
func (c *Cluster) logRefusal(name string, change int) {
	switch change {
	case 1:
		c.log.Warn("member refused", "member", name, "this_port", c.settings.VXLANPort,
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
	if c.settings == (Settings{}) || name == c.name {
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
				msg:  encodeSettings(c.versionForLocked(name), c.name, c.epoch, c.settings)})
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
