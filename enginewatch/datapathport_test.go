package enginewatch

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
)

// A manager's engine whose swarm uses another data-path port than the
// plugin's VXLAN port gets a WARN saying a firewall must pass both; the
// same port, or a worker's engine (which does not say), gets none.
func TestDataPathPortCompared(t *testing.T) {
	for _, c := range []struct {
		name     string
		manager  bool
		dataPath uint32
		warn     bool
	}{
		{"differs", true, 7789, true},
		{"same", true, 0, false},
		{"worker", false, 7789, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := enginetest.New()
			e.SetSwarm(c.manager, nil, nil)
			e.SetDataPathPort(c.dataPath)
			sock := filepath.Join(t.TempDir(), "e.sock")
			e.Serve(t, sock)
			engine := dockerengine.New(sock)
			defer engine.Close()
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			dp, ok := DataPathPort(context.Background(), engine, log)
			if want := c.manager; ok != want {
				t.Fatalf("the engine said a port: %v, want %v", ok, want)
			}
			WarnDataPathPort(4789, dp, ok, log)
			if got := strings.Contains(buf.String(), `msg="VXLAN port differs from Docker's"`); got != c.warn {
				t.Fatalf("WARN %v, want %v: %s", got, c.warn, buf.String())
			}
		})
	}
}
