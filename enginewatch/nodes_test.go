package enginewatch

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
)

// A worker is asked /info only (its engine would log every /nodes as an
// error); a manager /info, then /nodes.
func TestNodes(t *testing.T) {
	for _, c := range []struct {
		name               string
		manager, nodesFail bool
		want, wantAsked    []string
	}{
		{"worker", false, false, []string{"198.51.100.1", "2001:db8::2"}, []string{"/info"}},
		{"manager", true, false, []string{"198.51.100.1", "2001:db8::2", "198.51.100.1", "198.51.100.3"}, []string{"/info", "/nodes"}},
		// /nodes failing on a manager: the managers from /info still count.
		{"manager without leader", true, true, []string{"198.51.100.1", "2001:db8::2"}, []string{"/info", "/nodes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := enginetest.New()
			d.SetSwarm(c.manager, []string{"198.51.100.1:2377", "[2001:db8::2]:2377"}, []string{"198.51.100.1", "198.51.100.3"})
			if c.nodesFail {
				d.FailNodes()
			}
			sock := filepath.Join(t.TempDir(), "docker.sock")
			d.Serve(t, sock)
			var mu sync.Mutex
			var got []string
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				engine := dockerengine.New(sock)
				defer engine.Close()
				NewNodes(engine, func(a netip.Addr) {
					mu.Lock()
					got = append(got, a.String())
					mu.Unlock()
				}, time.Hour, slog.New(slog.DiscardHandler)).Run(ctx)
			}()
			// The hints come after both requests of a round.
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				n := len(got)
				mu.Unlock()
				if n >= len(c.want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			<-done
			if !slices.Equal(got, c.want) {
				t.Errorf("hints %v, want %v", got, c.want)
			}
			if asked := d.Paths(); !slices.Equal(asked, c.wantAsked) {
				t.Errorf("Docker was asked %v, want %v", asked, c.wantAsked)
			}
		})
	}
}
