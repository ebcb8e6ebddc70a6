package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/pluginapi/pluginapitest"
)

// The sandboxes' VXLAN port, without gossip: the setting when given; on a
// first run without one, 4789; on a later run, the port the state database
// holds (here one written by hand, to tell it from the default).
func TestServeVXLANPort(t *testing.T) {
	// sandboxPort creates network id and joins an endpoint to it, which
	// builds its sandbox, and returns the sandbox's VXLAN port.
	sandboxPort := func(t *testing.T, in *instance, id string, vni int) uint16 {
		t.Helper()
		c := unixClient(in.cfg.Socket)
		pluginapitest.Post(t, c, "http://plugin", "/NetworkDriver.CreateNetwork",
			pluginapitest.CreateNetwork(id, map[string]string{"vxlanid_list": fmt.Sprint(vni)}, "203.0.113.0/24")).OK(t, "CreateNetwork", nil)
		pluginapitest.Post(t, c, "http://plugin", "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": id, "EndpointID": "ep",
			"Interface": map[string]any{"Address": "203.0.113.2/24"}}).OK(t, "CreateEndpoint", nil)
		pluginapitest.Post(t, c, "http://plugin", "/NetworkDriver.Join", map[string]any{"NetworkID": id, "EndpointID": "ep", "SandboxKey": "/x"}).OK(t, "Join", nil)
		return in.kernel.Snapshot()[id].Spec.Port
	}
	run := func(t *testing.T, cfg serveConfig) *instance {
		k := fakekernel.New()
		in := start(t, cfg, testDeps(k))
		in.kernel = k
		in.waitHealthy(t)
		return in
	}
	stop := func(t *testing.T, in *instance) {
		if err := in.stop(t); err != nil {
			t.Fatal(err)
		}
	}

	cfg := testConfig(t)
	cfg.VXLANPort = 4790
	in := run(t, cfg)
	if got := sandboxPort(t, in, "given", 300); got != 4790 {
		t.Errorf("given 4790: the sandbox's port is %d", got)
	}
	stop(t, in)

	cfg = testConfig(t)
	cfg.VXLANPort = 0
	in = run(t, cfg)
	if got := sandboxPort(t, in, "first", 301); got != 4789 {
		t.Errorf("a first run with no port: the sandbox's port is %d, want 4789", got)
	}
	stop(t, in)
	db, err := bbolt.Open(filepath.Join(cfg.StateDir, stateDBName), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("controlplane"))
		if b == nil || b.Get([]byte("vxlan-port")) == nil {
			return fmt.Errorf("the first run stored no port")
		}
		return b.Put([]byte("vxlan-port"), []byte(`{"port":4791,"swarm":true}`))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	in = run(t, cfg)
	defer stop(t, in)
	if got := sandboxPort(t, in, "later", 302); got != 4791 {
		t.Errorf("a later run: the sandbox's port is %d, want the stored 4791", got)
	}
}
