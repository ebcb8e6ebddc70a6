package enginewatch

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/driver"
)

func TestTranslate(t *testing.T) {
	raw := []dockerengine.Service{
		{Name: "web", VIP: "10.0.1.2", Ports: []string{"Target: 80, Publish: 8080"},
			Tasks: []dockerengine.Task{{EndpointID: "e2", EndpointIP: "10.0.1.4"}, {EndpointID: "e1", EndpointIP: "10.0.1.3"}, {EndpointID: "e1"}}},
		{Name: "dns", VIP: ""},       // dnsrr: nothing to balance
		{Name: "dns2", VIP: "<nil>"}, // dnsrr as a real engine reports it
		{Name: "v6", VIP: "fd00::2", Tasks: []dockerengine.Task{{EndpointID: "e3", EndpointIP: "10.0.1.5"}}},
		{Name: "bad", VIP: "not-an-ip"},
		{Name: "zero", VIP: "0.0.0.0"},
		{Name: "api", VIP: "10.0.1.9/24"},
	}
	got, skipped := Translate(raw)
	want := []driver.Service{
		{Name: "api", VIP: netip.MustParseAddr("10.0.1.9")},
		{Name: "v6", VIP: netip.MustParseAddr("fd00::2"), Endpoints: []string{"e3"}},
		{Name: "web", VIP: netip.MustParseAddr("10.0.1.2"), Ports: []string{"Target: 80, Publish: 8080"}, Endpoints: []string{"e1", "e2"}},
	}
	if !slices.EqualFunc(got, want, func(a, b driver.Service) bool {
		return a.Name == b.Name && a.VIP == b.VIP && slices.Equal(a.Ports, b.Ports) && slices.Equal(a.Endpoints, b.Endpoints)
	}) {
		t.Errorf("Translate:\n got %+v\nwant %+v", got, want)
	}
	if len(skipped) != 2 {
		t.Errorf("skipped %q, want the two services with unusable VIPs", skipped)
	}
}

// fakeDriver records what it is handed.
type fakeDriver struct {
	mu   sync.Mutex
	nets []string
	got  map[string][]driver.Service
	at   map[string]time.Time
}

func (d *fakeDriver) ServiceNetworks() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.nets)
}

func (d *fakeDriver) SetServices(nid string, svcs []driver.Service) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got[nid], d.at[nid] = svcs, time.Now()
	return nil
}

func (d *fakeDriver) endpoints(nid string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, s := range d.got[nid] {
		out = append(out, s.Endpoints...)
	}
	return out
}

func start(t *testing.T, period time.Duration) (*enginetest.Engine, *fakeDriver, *Services) {
	e := enginetest.New()
	d := &fakeDriver{nets: []string{"n1"}, got: map[string][]driver.Service{}, at: map[string]time.Time{}}
	w := NewServices(e, d, period, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, d, w
}

func waitEndpoints(t *testing.T, d *fakeDriver, within time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if slices.Equal(d.endpoints("n1"), want) {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("after %v the driver has endpoints %v, want %v", within, d.endpoints("n1"), want)
	return 0
}

// A change the plugin's gossip reports reaches the driver at once, and a
// Docker table that trails the gossip is picked up by a follow-up, within
// a second: the staleness bound the README states.
func TestChangedIsFollowedWithinASecond(t *testing.T) {
	e, d, w := start(t, time.Hour)
	task := func(eid string) dockerengine.Task { return dockerengine.Task{EndpointID: eid} }
	e.SetServices("n1", dockerengine.Service{Name: "web", VIP: "10.0.1.2", Tasks: []dockerengine.Task{task("e1")}})
	w.Changed("n1")
	waitEndpoints(t, d, time.Second, "e1")

	// The gossip reports e2 before Docker lists it; Docker catches up
	// 300 ms later.
	w.Changed("n1")
	time.Sleep(300 * time.Millisecond)
	e.SetServices("n1", dockerengine.Service{Name: "web", VIP: "10.0.1.2", Tasks: []dockerengine.Task{task("e1"), task("e2")}})
	if took := waitEndpoints(t, d, time.Second, "e1", "e2"); took > 900*time.Millisecond {
		t.Errorf("a task Docker listed 300 ms after the change took another %v", took)
	}
	// Then the follow-ups end: no more requests without changes.
	time.Sleep(2500 * time.Millisecond)
	n := len(e.Asked("n1"))
	time.Sleep(500 * time.Millisecond)
	if m := len(e.Asked("n1")); m != n {
		t.Errorf("%d requests after the follow-ups ended", m-n)
	}
}

// A burst of changes is one request now and one per follow-up, not one
// per change.
func TestBurstIsCoalesced(t *testing.T) {
	e, _, w := start(t, time.Hour)
	e.SetServices("n1")
	start := time.Now()
	for range 1000 {
		w.Changed("n1")
	}
	burst := time.Since(start)
	time.Sleep(3 * time.Second)
	// One request per minGap of the burst, then the follow-ups.
	most := 2 + int(burst/minGap) + len(followUps)
	if n := len(e.Asked("n1")); n > most {
		t.Errorf("1000 changes in %v made %d requests, want at most %d", burst, n, most)
	}
}

// Two changes closer than minGap: the second's ask waits for minGap after
// the first's, and its first follow-up (minGap after the change, so less
// after that delayed ask) is left out. In virtual time, so the gaps are
// exact.
func TestAsksAreMinGapApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, _, w := start(t, time.Hour)
		e.SetServices("n1")
		w.Changed("n1")
		synctest.Wait() // asked at once
		time.Sleep(minGap / 2)
		w.Changed("n1")
		time.Sleep(3 * time.Second)
		var at []time.Duration
		times := e.Asked("n1")
		for _, a := range times {
			at = append(at, a.Sub(times[0]))
		}
		want := []time.Duration{0, minGap}
		for _, d := range followUps[1:] {
			want = append(want, minGap/2+d)
		}
		if !slices.Equal(at, want) {
			t.Errorf("asked at %v, want %v", at, want)
		}
	})
}

// Without changes, each network with containers here is asked every
// period; the others never.
func TestPeriodicRefresh(t *testing.T) {
	e, d, _ := start(t, 100*time.Millisecond)
	e.SetServices("n1", dockerengine.Service{Name: "web", VIP: "10.0.1.2", Tasks: []dockerengine.Task{{EndpointID: "e1"}}})
	waitEndpoints(t, d, 500*time.Millisecond, "e1")
	e.SetServices("n2", dockerengine.Service{Name: "x", VIP: "10.0.2.2"})
	time.Sleep(300 * time.Millisecond)
	if n := len(e.Asked("n2")); n != 0 {
		t.Errorf("a network without containers here was asked %d times", n)
	}
}
