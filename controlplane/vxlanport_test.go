package controlplane

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
)

// StartPort: the setting, else the stored port, else 4789 (stored) for a
// state database a previous release left, else nothing yet.
func TestStartPort(t *testing.T) {
	db := drivertest.StateDB(t)
	if pc, err := StartPort(db, 4790, false); err != nil || pc.Port != 4790 || pc.Source != "setting" {
		t.Fatalf("the setting: %+v %v", pc, err)
	}
	if pc, err := StartPort(db, 0, false); err != nil || pc.Port != 0 {
		t.Fatalf("a first run: %+v %v, want no port yet", pc, err)
	}
	if pc, err := StartPort(db, 0, true); err != nil || pc.Port != DefaultVXLANPort || pc.Swarm {
		t.Fatalf("a node that ran 0.1.0: %+v %v, want 4789", pc, err)
	}
	if pc, err := StartPort(db, 0, false); err != nil || pc.Port != DefaultVXLANPort || pc.Source != "state" {
		t.Fatalf("4789 was not stored for the next run: %+v %v", pc, err)
	}
	must(t, storePort(db, PortChoice{Port: 5789, Swarm: true}))
	if pc, err := StartPort(db, 0, true); err != nil || pc.Port != 5789 || !pc.Swarm {
		t.Fatalf("the stored port: %+v %v", pc, err)
	}
	if pc, err := StartPort(db, 4790, true); err != nil || pc.Port != 4790 {
		t.Fatalf("the setting over the stored port: %+v %v", pc, err)
	}
}

type fakeClusterPort struct {
	at     time.Time // when the members' port is heard; zero: never
	port   uint16
	swarm  bool
	member string
}

func (f fakeClusterPort) ClusterPort() (uint16, string, bool, bool) {
	if f.at.IsZero() || time.Now().Before(f.at) {
		return 0, "", false, false
	}
	return f.port, f.member, f.swarm, true
}

// settleFirstRun: the members' port as soon as one tells it; a manager
// waits for them briefly and then takes Docker's data-path port, a swarm
// worker waits longer and then takes 4789, a node without an engine waits
// briefly.
func TestSettleFirstRun(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		name    string
		heard   time.Duration // after start; 0: never
		port    uint16
		swarm   bool
		dp      uint16
		manager bool
		engine  bool
		want    PortChoice
		took    time.Duration
	}{
		{"worker hears a member following Docker", 3 * time.Second, 5789, true, 0, false, true, PortChoice{Port: 5789, Swarm: true, Source: "member n1"}, 3 * time.Second},
		{"worker hears nobody", 0, 0, false, 0, false, true, PortChoice{Port: DefaultVXLANPort, Source: "default"}, workerWait},
		{"no engine, nobody heard", 0, 0, false, 0, false, false, PortChoice{Port: DefaultVXLANPort, Source: "default"}, managerWait},
		{"manager hears nobody", 0, 0, false, 5789, true, true, PortChoice{Port: 5789, Swarm: true, Source: "Docker's data-path port"}, managerWait},
		{"manager hears a cluster on 4789", time.Second, 4789, false, 5789, true, true, PortChoice{Port: 4789, Source: "member n1"}, time.Second},
		{"manager hears its Docker's port", time.Second, 5789, false, 5789, true, true, PortChoice{Port: 5789, Swarm: true, Source: "member n1"}, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				f := fakeClusterPort{port: c.port, swarm: c.swarm, member: "n1"}
				if c.heard != 0 {
					f.at = start.Add(c.heard)
				}
				got := settleFirstRun(context.Background(), f, c.dp, c.manager, c.engine, log)
				if got != c.want {
					t.Errorf("got %+v, want %+v", got, c.want)
				}
				if took := time.Since(start); took < c.took || took > c.took+200*time.Millisecond {
					t.Errorf("took %v, want %v", took, c.took)
				}
			})
		})
	}
	if got := settleFirstRun(context.Background(), nil, 5789, true, true, log); got.Port != 5789 || !got.Swarm {
		t.Errorf("a manager without gossip: %+v", got)
	}
	if got := settleFirstRun(context.Background(), nil, 0, false, false, log); got.Port != DefaultVXLANPort {
		t.Errorf("a worker without gossip: %+v", got)
	}
}

// The members' keys that arrive before the IPsec manager exists reach it
// when it is attached, the latest of each member's, and later ones
// straight.
func TestKeyRelay(t *testing.T) {
	a, b := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	var r keyRelay[[]byte]
	r.deliver(a, []byte("a1"))
	r.deliver(b, []byte("b1"))
	r.deliver(a, []byte("a2"))
	got := map[netip.Addr][]string{}
	r.attach(func(x netip.Addr, d []byte) { got[x] = append(got[x], string(d)) })
	r.deliver(b, []byte("b2"))
	if len(got[a]) != 1 || got[a][0] != "a2" || len(got[b]) != 2 || got[b][0] != "b1" || got[b][1] != "b2" {
		t.Fatalf("the manager got %v", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
