package dockerengine_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
)

// A manager's engine says the swarm's data-path port (0: the default,
// 4789); a worker's says nothing.
func TestDataPathPort(t *testing.T) {
	e := enginetest.New()
	sock := filepath.Join(t.TempDir(), "engine.sock")
	e.Serve(t, sock)
	c := dockerengine.New(sock)
	defer c.Close()
	ctx := context.Background()
	if _, ok, err := c.DataPathPort(ctx); ok || err != nil {
		t.Fatalf("a worker: ok %v, %v", ok, err)
	}
	e.SetSwarm(true, nil, nil)
	if p, ok, err := c.DataPathPort(ctx); p != 4789 || !ok || err != nil {
		t.Fatalf("a manager with the default: %d %v %v", p, ok, err)
	}
	e.SetDataPathPort(7789)
	if p, ok, err := c.DataPathPort(ctx); p != 7789 || !ok || err != nil {
		t.Fatalf("a manager with --data-path-port 7789: %d %v %v", p, ok, err)
	}
	e.SetDataPathPort(70000)
	if _, _, err := c.DataPathPort(ctx); err == nil {
		t.Fatal("an out-of-range port accepted")
	}
}
