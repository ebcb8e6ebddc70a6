package controlplane

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
	"github.com/overlay-plugin/overlay-plugin/kernel"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

const (
	strayA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	strayB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// lostState is a driver started on a kernel whose sandbox "lost" runs two
// containers and an empty state database: two strays.
func lostState(t *testing.T) *driver.Driver {
	t.Helper()
	k := fakekernel.New()
	k.AddLeftover(kernel.SandboxSpec{Name: "lost", VNI: 400, Port: 4789, Local: drivertest.VTEP, MTU: 1450})
	for _, eid := range []string{strayA, strayB} {
		short := eid[:12]
		v := kernel.Veth{HostName: kernel.HostVethPrefix + short, SandboxName: "ovs" + short, MTU: 1450} // named as Join names them
		if err := k.AddVeth("lost", v); err != nil {
			t.Fatal(err)
		}
		k.MoveToContainer(v.HostName)
	}
	db := drivertest.StateDB(t)
	d, err := driver.New(driver.Config{Kernel: k, Underlay: drivertest.Underlay{Addr: drivertest.VTEP}, VNIs: drivertest.VNIs(t, db),
		DB: db, AdvertiseAddr: drivertest.VTEP, VXLANPort: 4789, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Strays(); len(got) != 1 {
		t.Fatalf("strays in %v, want the lost sandbox", got)
	}
	return d
}

func attachment(eid, mac, ip string) dockerengine.Attachment {
	return dockerengine.Attachment{Name: "task-" + eid[:4], EndpointID: eid, MacAddress: mac, IPv4Address: ip}
}

func endpointIDs(d *driver.Driver) []string {
	var out []string
	for _, n := range d.State() {
		for _, ep := range n.Endpoints {
			out = append(out, ep.ID)
		}
	}
	return out
}

func logTo(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

func TestRecoverFromTheEngine(t *testing.T) {
	d := lostState(t)
	e := enginetest.New()
	e.SetContainers("lost",
		attachment(strayA, "02:42:0a:00:00:05", "10.0.0.5/24"),
		attachment("cccccccccccccccccccccccccccccccc", "02:42:0a:00:00:06", "10.0.0.6/24"), // not in this sandbox
		attachment(strayB, "not a mac", "10.0.0.7/24"))
	var log bytes.Buffer
	recoverEndpoints(context.Background(), e, d, time.Second, logTo(&log))
	if got := endpointIDs(d); len(got) != 1 || got[0] != strayA {
		t.Fatalf("endpoints %v, want [%s]\n%s", got, strayA, log.String())
	}
	for _, want := range []string{"engine endpoint unusable", "not a mac", "endpoints recovered from the engine", "recovered=1 listed=3"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}

// flaky fails its first calls as an engine not listening yet does.
type flaky struct {
	e     *enginetest.Engine
	fails atomic.Int32
}

func (f *flaky) NetworkContainers(ctx context.Context, id string) ([]dockerengine.Attachment, error) {
	if f.fails.Add(-1) >= 0 {
		return nil, &url.Error{Op: "Get", URL: "http://docker/networks/" + id, Err: context.DeadlineExceeded}
	}
	return f.e.NetworkContainers(ctx, id)
}

func TestRecoverWaitsForTheEngine(t *testing.T) {
	d := lostState(t)
	e := enginetest.New()
	e.SetContainers("lost", attachment(strayA, "02:42:0a:00:00:05", "10.0.0.5/24"))
	f := &flaky{e: e}
	f.fails.Store(3)
	var log bytes.Buffer
	recoverEndpoints(context.Background(), f, d, 5*time.Second, logTo(&log))
	if got := endpointIDs(d); len(got) != 1 {
		t.Fatalf("after the engine answered: %v\n%s", got, log.String())
	}
	// An engine that never answers: given up on after the wait, said.
	d, log = lostState(t), bytes.Buffer{}
	f.fails.Store(1 << 30)
	recoverEndpoints(context.Background(), f, d, 300*time.Millisecond, logTo(&log))
	if got := endpointIDs(d); len(got) != 0 || !strings.Contains(log.String(), "the engine did not answer in time") {
		t.Fatalf("endpoints %v; log:\n%s", got, log.String())
	}
	// No engine at all: said at once.
	d, log = lostState(t), bytes.Buffer{}
	recoverEndpoints(context.Background(), nil, d, time.Hour, logTo(&log))
	if !strings.Contains(log.String(), "without the engine (--docker-socket) nothing names them") {
		t.Fatalf("log:\n%s", log.String())
	}
}

// Over the engine's real API: an answer that does not parse is an error
// said in the log, and changes nothing; a network the engine does not
// know is said too.
func TestRecoverRefusesAGarbledAnswer(t *testing.T) {
	d := lostState(t)
	e := enginetest.New()
	e.SetContainers("lost", attachment(strayA, "02:42:0a:00:00:05", "10.0.0.5/24"))
	e.Garble("lost")
	sock := filepath.Join(t.TempDir(), "engine.sock")
	e.Serve(t, sock)
	c := dockerengine.New(sock)
	defer c.Close()
	var log bytes.Buffer
	recoverEndpoints(context.Background(), c, d, time.Second, logTo(&log))
	if got := endpointIDs(d); len(got) != 0 || !strings.Contains(log.String(), "the engine's answer is unusable") {
		t.Fatalf("endpoints %v; log:\n%s", got, log.String())
	}
	e2 := enginetest.New()
	sock2 := filepath.Join(t.TempDir(), "engine.sock")
	e2.Serve(t, sock2)
	c2 := dockerengine.New(sock2)
	defer c2.Close()
	log.Reset()
	recoverEndpoints(context.Background(), c2, d, time.Second, logTo(&log))
	if !strings.Contains(log.String(), "the engine does not know the network") {
		t.Fatalf("log:\n%s", log.String())
	}
}
