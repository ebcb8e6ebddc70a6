package main

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/pluginapi/pluginapitest"
)

// At the default port the sandboxes follow the swarm's data-path port a
// manager's engine gives; a port set otherwise stays, whatever Docker's.
func TestPortFromDocker(t *testing.T) {
	for _, c := range []struct {
		name     string
		setting  uint16
		dataPath uint32
		manager  bool
		wantPort uint16
	}{
		{"default follows", 4789, 7789, true, 7789},
		{"worker", 4789, 7789, false, 4789},
		{"set", 4790, 7789, true, 4790},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := enginetest.New()
			e.SetSwarm(c.manager, nil, nil)
			e.SetDataPathPort(c.dataPath)
			sock := filepath.Join(t.TempDir(), "engine.sock")
			e.Serve(t, sock)
			cfg := testConfig(t)
			cfg.VXLANPort, cfg.VXLANPortGiven = c.setting, c.setting != defaultVXLANPort
			cfg.DockerSocket, cfg.AdvertiseAddr = sock, netip.MustParseAddr("198.51.100.1")
			k := fakekernel.New()
			in := start(t, cfg, testDeps(k))
			in.waitHealthy(t)
			cl := unixClient(cfg.Socket)
			opts := map[string]string{"vxlanid_list": "300"}
			pluginapitest.Post(t, cl, "http://p", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net1", opts, "203.0.113.0/24")).OK(t, "create", nil)
			pluginapitest.Post(t, cl, "http://p", "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "net1", "EndpointID": "ep1",
				"Interface": map[string]any{"Address": "203.0.113.1/24"}}).OK(t, "endpoint", nil)
			pluginapitest.Post(t, cl, "http://p", "/NetworkDriver.Join", map[string]any{"NetworkID": "net1", "EndpointID": "ep1", "SandboxKey": "/x"}).OK(t, "join", nil)
			wait.For(t, 10*time.Second, 20*time.Millisecond, "the sandbox", wait.Bool(func() bool { return k.Snapshot()["net1"] != nil }))
			if got := k.Snapshot()["net1"].Spec.Port; got != c.wantPort {
				t.Fatalf("sandbox on UDP %d, want %d", got, c.wantPort)
			}
		})
	}
}
