package encryption_test

import (
	"testing"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// Keys gossiped as node data reach the manager as SetPeerKeys would hand
// them; unreadable data changes nothing.
func TestReceiveKeys(t *testing.T) {
	c := &clock{t: encryption.TestT0}
	a, b := twoHosts(t, c)
	data, err := encryption.EncodePublicKeys(a.published())
	if err != nil {
		t.Fatal(err)
	}
	b.m.ReceiveKeys(a.addr, []byte("not keys"))
	b.m.ReceiveKeys(a.addr, data)
	if err := a.m.SetPeerKeys(b.addr, b.published()); err != nil {
		t.Fatal(err)
	}
	tick(t, a, b)
	checkPath(t, a, b)
	checkPath(t, b, a)
}
