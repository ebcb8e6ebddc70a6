package encryption_test

import (
	"bytes"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

func TestPairSecret(t *testing.T) {
	for _, c := range []struct {
		name      string
		own, peer []string
		said      bool
		want      string // "": none shared
	}{
		{"one secret, as before keyrings", []string{"o"}, []string{"o"}, true, "o"},
		{"a peer that said nothing: this host's primary", []string{"n", "o"}, nil, false, "n"},
		{"new added here, not there", []string{"o", "n"}, []string{"o"}, true, "o"},
		{"new added on both, old still primary", []string{"o", "n"}, []string{"o", "n"}, true, "o"},
		{"new primary here, the peer holds both", []string{"n", "o"}, []string{"o", "n"}, true, "n"},
		{"new primary here, the peer still old alone", []string{"n", "o"}, []string{"o"}, true, "o"},
		{"old removed here, the peer holds both", []string{"n"}, []string{"o", "n"}, true, "n"},
		{"old removed here, the peer holds old alone", []string{"n"}, []string{"o"}, true, ""},
		{"the peer said it holds none", []string{"o"}, []string{}, true, ""},
		{"three in flight", []string{"c", "b", "a"}, []string{"a", "b"}, true, "b"},
	} {
		got, ok := encryption.PairSecret(c.own, c.peer, c.said)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("%s: %q %v, want %q", c.name, got, ok, c.want)
		}
	}
}

// TestSecretRollNeverLosesAPacket: three hosts roll from one cluster
// secret to another as the README says (add the new one everywhere, make
// it primary everywhere, remove the old one), each host at its own moment
// and telling the others its secrets' ids after it reloaded, as the
// control plane does. After every single change every pair's traffic
// has its SA at the receiver; at the end every pair sends with the new
// secret, and no SA of the old one is left. A host left with the old
// secret alone is refused and counted.
func TestSecretRollNeverLosesAPacket(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	hosts := []*host{newHost(t, "198.51.100.1", c.now), newHost(t, "198.51.100.2", c.now), newHost(t, "198.51.100.3", c.now)}
	mesh(t, hosts...)
	gossip(t, hosts...)
	oldS := encryption.TestSalts[0]
	newS := encryption.Salt{ID: "0000000b", Key: bytes.Repeat([]byte{0xb}, encryption.SecretLen)}
	checkAll := func(step string, among []*host) {
		t.Helper()
		for _, a := range among {
			for _, b := range among {
				if a != b {
					t.Run(step, func(t *testing.T) { checkPath(t, a, b) })
				}
			}
		}
	}
	// reload is one host's changed secret file: its manager first, then
	// the others hear the ids.
	reload := func(h *host, among []*host, salts ...encryption.Salt) {
		t.Helper()
		if err := h.m.SetSalts(salts); err != nil {
			t.Fatal(err)
		}
		checkAll("reloaded "+h.addr.String(), among)
		var ids []string
		for _, s := range salts {
			ids = append(ids, s.ID)
		}
		for _, o := range hosts {
			if o != h {
				if err := o.m.SetPeerSecrets(h.addr, ids); err != nil {
					t.Fatal(err)
				}
				checkAll("told "+o.addr.String()+" of "+h.addr.String(), among)
			}
		}
	}
	checkAll("start", hosts)
	for _, h := range hosts {
		reload(h, hosts, oldS, newS)
	}
	for _, h := range hosts {
		reload(h, hosts, newS, oldS)
	}
	for _, h := range hosts {
		reload(h, hosts, newS)
	}
	for _, h := range hosts {
		st := h.m.Status()
		pairs := h.m.PairSecrets()
		for _, r := range st.Remotes {
			if r.Secret != newS.ID || pairs[r.VTEP] != r.Secret {
				t.Errorf("%s sends to %s with secret %q (PairSecrets: %q), want %s", h.addr, r.VTEP, r.Secret, pairs[r.VTEP], newS.ID)
			}
		}
		states, _ := h.x.States()
		if len(states) != 2*(1+1) { // per peer: one inbound (one secret, one generation each), one outbound
			t.Errorf("%s holds %d SAs, want 4: the old secret's are not all gone", h.addr, len(states))
		}
	}

	// The third host goes back to the old secret alone: the others refuse
	// it (blocked, counted), and still talk to each other.
	reload(hosts[2], hosts[:2], oldS)
	for _, h := range hosts[:2] {
		st := h.m.Status()
		if st.Unshared != 1 {
			t.Errorf("%s counted %d hosts sharing no secret, want 1", h.addr, st.Unshared)
		}
		for _, r := range st.Remotes {
			if r.VTEP == hosts[2].addr && !r.Blocked {
				t.Errorf("%s still sends to %s, which shares no secret", h.addr, r.VTEP)
			}
		}
	}
	if err := hosts[0].m.SetSalts(nil); err == nil {
		t.Error("an empty keyring accepted")
	}
	if err := hosts[0].m.SetSalts([]encryption.Salt{newS, newS}); err == nil {
		t.Error("a keyring with a secret twice accepted")
	}
	checkAll("after refused keyrings", hosts[:2])
}
