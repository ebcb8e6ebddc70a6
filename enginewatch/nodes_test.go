package enginewatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
)

// fakeDocker is an engine's API on a unix socket: /info, and /nodes, which
// as on a real engine only a manager answers (a worker says 503). It
// records the paths it is asked.
type fakeDocker struct {
	sock    string
	manager bool
	// nodesFail makes a manager's /nodes fail (a manager without quorum).
	nodesFail bool

	mu    sync.Mutex
	paths []string
}

func newFakeDocker(t *testing.T, manager, nodesFail bool) *fakeDocker {
	d := &fakeDocker{sock: filepath.Join(t.TempDir(), "docker.sock"), manager: manager, nodesFail: nodesFail}
	l, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", func(w http.ResponseWriter, r *http.Request) {
		d.record(r)
		fmt.Fprintf(w, `{"Swarm":{"NodeID":"x","LocalNodeState":"active","ControlAvailable":%v,`+
			`"RemoteManagers":[{"NodeID":"a","Addr":"198.51.100.1:2377"},{"NodeID":"b","Addr":"[2001:db8::2]:2377"}]}}`, manager)
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		d.record(r)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case !manager:
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"message":"This node is not a swarm manager. Worker nodes can't be used to view or modify cluster state. Please run this command on a manager node or promote the current node to a manager."}`)
		case nodesFail:
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"message":"The swarm does not have a leader. It's possible that too few managers are online."}`)
		default:
			io.WriteString(w, `[{"Status":{"Addr":"198.51.100.1"}},{"Status":{"Addr":"198.51.100.3"}}]`)
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return d
}

func (d *fakeDocker) record(r *http.Request) {
	d.mu.Lock()
	d.paths = append(d.paths, r.URL.Path)
	d.mu.Unlock()
}

func (d *fakeDocker) asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.paths)
}

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
			d := newFakeDocker(t, c.manager, c.nodesFail)
			var mu sync.Mutex
			var got []string
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				engine := dockerengine.New(d.sock)
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
			if asked := d.asked(); !slices.Equal(asked, c.wantAsked) {
				t.Errorf("Docker was asked %v, want %v", asked, c.wantAsked)
			}
		})
	}
}
