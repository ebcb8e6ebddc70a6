package encryption

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"testing"
	"time"
)

var (
	secret = bytes.Repeat([]byte{7}, SecretLen)
	hostA  = netip.MustParseAddr("198.51.100.1")
	hostB  = netip.MustParseAddr("198.51.100.2")
	t0     = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

func testSchedule() Schedule {
	return Schedule{Interval: time.Hour, Lead: time.Minute, Grace: 2 * time.Minute}
}

func TestBothEndsDeriveTheSameSA(t *testing.T) {
	ka, err := NewKeyring(testSchedule(), t0)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := NewKeyring(testSchedule(), t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := ka.Public()[0], kb.Public()[0]
	d := Direction{Src: hostA, Dst: hostB, SrcGen: pa.Gen, DstGen: pb.Gen}
	sharedA, err := ka.Shared(pa.Gen, pb.Key)
	if err != nil {
		t.Fatal(err)
	}
	sharedB, err := kb.Shared(pb.Gen, pa.Key)
	if err != nil {
		t.Fatal(err)
	}
	saA, err := DeriveSA(sharedA, secret, d)
	if err != nil {
		t.Fatal(err)
	}
	saB, err := DeriveSA(sharedB, secret, d)
	if err != nil {
		t.Fatal(err)
	}
	if saA.SPI != saB.SPI || !bytes.Equal(saA.Key, saB.Key) || len(saA.Key) != KeyLen {
		t.Fatalf("ends disagree: %x/%d vs %x/%d", saA.Key, saA.SPI, saB.Key, saB.SPI)
	}
	// The reverse direction, another generation, another secret or another
	// address each give a different key and SPI.
	rev := Direction{Src: hostB, Dst: hostA, SrcGen: pb.Gen, DstGen: pa.Gen}
	variants := map[string]func() (SA, error){
		"reverse":    func() (SA, error) { return DeriveSA(sharedA, secret, rev) },
		"generation": func() (SA, error) { d2 := d; d2.SrcGen++; return DeriveSA(sharedA, secret, d2) },
		"secret":     func() (SA, error) { return DeriveSA(sharedA, bytes.Repeat([]byte{8}, SecretLen), d) },
		"address": func() (SA, error) {
			d2 := d
			d2.Dst = netip.MustParseAddr("198.51.100.3")
			return DeriveSA(sharedA, secret, d2)
		},
	}
	for name, f := range variants {
		sa, err := f()
		if err != nil {
			t.Fatal(err)
		}
		if sa.SPI == saA.SPI || bytes.Equal(sa.Key, saA.Key) {
			t.Errorf("%s: same key or SPI as the original direction", name)
		}
	}
}

// TestDeriveSAVector pins the derivation, so a change to it (which would
// break mixed-version clusters) cannot go unnoticed.
func TestDeriveSAVector(t *testing.T) {
	privA, err := ecdh.X25519().NewPrivateKey(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	privB, err := ecdh.X25519().NewPrivateKey(bytes.Repeat([]byte{2}, 32))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := privA.ECDH(privB.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	sa, err := DeriveSA(shared, secret, Direction{Src: hostA, Dst: hostB, SrcGen: 1, DstGen: 2})
	if err != nil {
		t.Fatal(err)
	}
	const wantSPI = 0x77b68fba
	wantKey, _ := hex.DecodeString("0b75563830ddaa5b18c3c535c8b1e9a810f9111ea52f728b8e1be821de3ebe641fd6bc70")
	if sa.SPI != wantSPI || !bytes.Equal(sa.Key, wantKey) {
		t.Fatalf("derivation changed: spi=%#08x key=%x", sa.SPI, sa.Key)
	}
}

func TestDeriveSARejectsBadInput(t *testing.T) {
	shared := make([]byte, 32)
	_, _ = rand.Read(shared)
	if _, err := DeriveSA(shared, secret[:16], Direction{}); err == nil {
		t.Error("short secret accepted")
	}
	if _, err := DeriveSA(shared[:16], secret, Direction{}); err == nil {
		t.Error("short shared secret accepted")
	}
}

func TestScheduleValidate(t *testing.T) {
	if err := DefaultSchedule.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []Schedule{{}, {Interval: time.Minute, Lead: time.Minute, Grace: time.Second}, {Interval: time.Hour, Lead: -1, Grace: 1}} {
		if s.Validate() == nil {
			t.Errorf("schedule %+v accepted", s)
		}
	}
}

func TestRotationSchedule(t *testing.T) {
	s := testSchedule()
	k, err := NewKeyring(s, t0)
	if err != nil {
		t.Fatal(err)
	}
	first := k.Public()[0]
	if a, ok := Active(k.Public(), t0); !ok || a.Gen != first.Gen {
		t.Fatal("first generation not active at once")
	}
	// Nothing happens until Lead before the interval ends.
	if changed, _ := k.Tick(t0.Add(s.Interval - s.Lead - time.Second)); changed || len(k.Public()) != 1 {
		t.Fatal("rotated early")
	}
	now := t0.Add(s.Interval - s.Lead)
	if changed, _ := k.Tick(now); !changed || len(k.Public()) != 2 {
		t.Fatal("next generation not published Lead ahead")
	}
	next := k.Public()[1]
	if !next.ActivateAt.Equal(t0.Add(s.Interval)) {
		t.Fatalf("next activates at %v, want %v", next.ActivateAt, t0.Add(s.Interval))
	}
	if a, _ := Active(k.Public(), now); a.Gen != first.Gen {
		t.Fatal("senders switched before activation")
	}
	if a, _ := Active(k.Public(), next.ActivateAt); a.Gen != next.Gen {
		t.Fatal("senders did not switch at activation")
	}
	// The old generation still receives during Grace, then is wiped.
	if changed, _ := k.Tick(next.ActivateAt.Add(s.Grace - time.Second)); changed {
		t.Fatal("old generation dropped within grace")
	}
	if _, err := k.Shared(first.Gen, next.Key); err != nil {
		t.Fatalf("old generation unusable within grace: %v", err)
	}
	old := k.gens[0]
	if changed, _ := k.Tick(next.ActivateAt.Add(s.Grace)); !changed || len(k.Public()) != 1 {
		t.Fatal("old generation kept past grace")
	}
	if old.priv != nil {
		t.Fatal("retired private key still referenced")
	}
	if _, err := k.Shared(first.Gen, next.Key); err == nil {
		t.Fatal("retired generation still computes shared secrets")
	}
}

// TestRotationUnderClockSkew checks that with skew below Lead and Grace a
// sender never uses a generation its receiver cannot decrypt: the receiver
// installs inbound SAs for every generation it has learnt and not retired.
func TestRotationUnderClockSkew(t *testing.T) {
	s := testSchedule()
	const skew = 40 * time.Second // sender's clock ahead of the receiver's
	recv, err := NewKeyring(s, t0)
	if err != nil {
		t.Fatal(err)
	}
	for step := time.Duration(0); step < 5*s.Interval; step += 10 * time.Second {
		recvNow := t0.Add(step)
		if _, err := recv.Tick(recvNow); err != nil {
			t.Fatal(err)
		}
		senderNow := recvNow.Add(skew)
		a, ok := Active(recv.Public(), senderNow)
		if !ok {
			t.Fatalf("at %v the sender sees no active generation", step)
		}
		if _, err := recv.Shared(a.Gen, recv.Public()[0].Key); err != nil {
			t.Fatalf("at %v the sender uses generation %d the receiver has retired", step, a.Gen)
		}
		// And a sender behind by the same skew.
		a, _ = Active(recv.Public(), recvNow.Add(-skew))
		if _, err := recv.Shared(a.Gen, recv.Public()[0].Key); err != nil {
			t.Fatalf("at %v a lagging sender uses generation %d the receiver has retired", step, a.Gen)
		}
	}
}

func TestForceRotate(t *testing.T) {
	k, err := NewKeyring(testSchedule(), t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.ForceRotate(t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	pub := k.Public()
	if len(pub) != 2 || pub[1].Gen <= pub[0].Gen || !pub[1].ActivateAt.Equal(t0.Add(time.Second+time.Minute)) {
		t.Fatalf("forced rotation: %+v", pub)
	}
}
