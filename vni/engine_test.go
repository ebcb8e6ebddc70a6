package vni

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
)

// discard drops the recovery's log.
var discard = slog.New(slog.DiscardHandler)

// TestRecoverFromEngine: the engine's list, once it answers, fills the
// VNI table with this driver's networks (not Docker's own overlay's), and
// allocations waiting meanwhile get a VNI no running network holds.
func TestRecoverFromEngine(t *testing.T) {
	vnis := newAlloc(t, DefaultRange)
	engine := enginetest.New()
	engine.SetNetworks(2, []dockerengine.Network{
		{ID: "ours", Driver: "overlay-plugin:latest", Options: map[string]string{"vxlanid_list": "256"}},
		{ID: "docker", Driver: "overlay", Options: map[string]string{"com.docker.network.driver.overlay.vxlanid_list": "4097", "vxlanid_list": "257"}},
		{ID: "bad", Driver: "overlay-plugin:latest", Options: map[string]string{"vxlanid_list": "x"}},
		{ID: "bridge", Driver: "bridge"},
	}...)
	release := vnis.Hold(time.Minute)
	done := make(chan struct{})
	go func() {
		defer close(done)
		vnis.RecoverFromEngine(context.Background(), engine, "vxlanid_list", release, discard)
	}()
	v, err := vnis.Allocate("new")
	if err != nil || v != 257 {
		t.Fatalf("Allocate during recovery = %d, %v; want 257", v, err)
	}
	<-done
	if v, ok := vnis.Lookup("ours"); !ok || v != 256 {
		t.Fatalf("recovered %d %v, want 256", v, ok)
	}
	if _, ok := vnis.Lookup("docker"); ok {
		t.Fatal("Docker's own overlay network recorded")
	}
}

// TestRecoverFromEngineUnreachable: without an answer the hold ends with
// the attempts, and allocation goes on with local knowledge.
func TestRecoverFromEngineUnreachable(t *testing.T) {
	vnis := newAlloc(t, DefaultRange)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	engine := enginetest.New()
	engine.SetNetworks(1 << 30)
	vnis.RecoverFromEngine(ctx, engine, "vxlanid_list", vnis.Hold(time.Minute), discard)
	if _, err := vnis.Allocate("new"); err != nil {
		t.Fatalf("Allocate after a failed recovery: %v", err)
	}
}

// TestRecoverFromEngineRefused: an engine that answers without a list
// ends the hold at once.
func TestRecoverFromEngineRefused(t *testing.T) {
	vnis := newAlloc(t, DefaultRange)
	engine := enginetest.New() // no list: the engine refuses the call
	vnis.RecoverFromEngine(context.Background(), engine, "vxlanid_list", vnis.Hold(time.Minute), discard)
	if n := engine.NetworksAsked(); n != 1 {
		t.Fatalf("asked %d times, want once", n)
	}
	if _, err := vnis.Allocate("new"); err != nil {
		t.Fatalf("Allocate after a refused recovery: %v", err)
	}
}
