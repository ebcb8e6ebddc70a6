package gossip

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// fakeEngine stands in for a node's Docker engine where the plugin asks it
// (--docker-socket): GET /info, and GET /networks/<id>?verbose=true with
// the services the test sets, as Docker's gossip would list them there.
type fakeEngine struct {
	path string
	srv  *http.Server

	mu       sync.Mutex
	services map[string]map[string]engineService // network → name → service
	asked    int
}

type engineService struct {
	VIP   string
	Ports []string
	Tasks []engineTask
}

type engineTask struct {
	Name       string
	EndpointID string
	EndpointIP string
}

func startEngine(t *testing.T, path string) *fakeEngine {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	e := &fakeEngine{path: path, services: map[string]map[string]engineService{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"Swarm":{"ControlAvailable":false,"RemoteManagers":[]}}`))
	})
	mux.HandleFunc("GET /networks/{id}", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.asked++
		svcs, ok := e.services[r.PathValue("id")]
		if !ok || r.URL.Query().Get("verbose") != "true" {
			http.Error(w, `{"message":"network not found"}`, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"Services": svcs})
	})
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := e.srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("fake engine %s: %v", path, err)
		}
	}()
	t.Cleanup(func() { e.srv.Close() })
	return e
}

// set makes the network's service name have vip and the given tasks (or
// removes it when vip is empty).
func (e *fakeEngine) set(nid, name, vip string, tasks ...*testbed.Endpoint) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.services[nid] == nil {
		e.services[nid] = map[string]engineService{}
	}
	if vip == "" {
		delete(e.services[nid], name)
		return
	}
	s := engineService{VIP: vip, Ports: []string{}, Tasks: []engineTask{}}
	for i, ep := range tasks {
		s.Tasks = append(s.Tasks, engineTask{Name: name + "." + strings.Repeat("x", i+1), EndpointID: ep.ID,
			EndpointIP: ep.Addrs[0].Addr().String()})
	}
	e.services[nid][name] = s
}
