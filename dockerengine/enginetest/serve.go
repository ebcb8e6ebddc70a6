package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
)

// Serve answers the engine's API on a unix socket at path until the test
// ends: GET /info, /nodes (as a real engine, a worker's says 503),
// /networks and /networks/<id>?verbose=true.
func (e *Engine) Serve(t testing.TB, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", e.info)
	mux.HandleFunc("GET /nodes", e.nodesList)
	mux.HandleFunc("GET /networks", func(w http.ResponseWriter, r *http.Request) {
		e.record(r)
		nets, err := e.Networks(r.Context())
		if err != nil {
			http.Error(w, `{"message":"page not found"}`, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(nets)
	})
	mux.HandleFunc("GET /networks/{id}", func(w http.ResponseWriter, r *http.Request) {
		e.record(r)
		if r.URL.Query().Get("verbose") != "true" {
			e.containersOf(w, r.PathValue("id"))
			return
		}
		svcs, err := e.NetworkServices(r.Context(), r.PathValue("id"))
		if err != nil {
			http.Error(w, `{"message":"network not found"}`, http.StatusNotFound)
			return
		}
		type service struct {
			VIP   string
			Ports []string
			Tasks any
		}
		out := map[string]service{}
		for _, s := range svcs {
			out[s.Name] = service{VIP: s.VIP, Ports: append([]string{}, s.Ports...), Tasks: s.Tasks}
		}
		json.NewEncoder(w).Encode(map[string]any{"Services": out})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("fake engine %s: %v", path, err)
		}
	}()
	t.Cleanup(func() { srv.Close() })
}

// containersOf answers a network's plain inspect: this node's containers.
func (e *Engine) containersOf(w http.ResponseWriter, nid string) {
	e.mu.Lock()
	garbled := e.garbled[nid]
	e.mu.Unlock()
	if garbled {
		io.WriteString(w, `{"Containers": {"x": [`)
		return
	}
	cs, err := e.NetworkContainers(context.Background(), nid)
	if err != nil {
		http.Error(w, `{"message":"network not found"}`, http.StatusNotFound)
		return
	}
	out := map[string]dockerengine.Attachment{}
	for i, c := range cs {
		out[fmt.Sprintf("container%d", i)] = c
	}
	json.NewEncoder(w).Encode(map[string]any{"Containers": out})
}

func (e *Engine) record(r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paths = append(e.paths, r.URL.Path)
}

func (e *Engine) info(w http.ResponseWriter, r *http.Request) {
	e.record(r)
	e.mu.Lock()
	defer e.mu.Unlock()
	type manager struct{ Addr string }
	ms := []manager{}
	for _, a := range e.managers {
		ms = append(ms, manager{a})
	}
	swarm := map[string]any{"ControlAvailable": e.manager, "RemoteManagers": ms}
	if e.manager { // only a manager's engine says the cluster's settings
		cluster := map[string]any{}
		if e.dataPathPort != 0 {
			cluster["DataPathPort"] = e.dataPathPort
		}
		swarm["Cluster"] = cluster
	}
	json.NewEncoder(w).Encode(map[string]any{"Swarm": swarm})
}

func (e *Engine) nodesList(w http.ResponseWriter, r *http.Request) {
	e.record(r)
	e.mu.Lock()
	defer e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case !e.manager:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"message":"This node is not a swarm manager. Worker nodes can't be used to view or modify cluster state. Please run this command on a manager node or promote the current node to a manager."}`)
	case e.nodesFail:
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"message":"The swarm does not have a leader. It's possible that too few managers are online."}`)
	default:
		type node struct{ Status struct{ Addr string } }
		out := []node{}
		for _, a := range e.nodes {
			var n node
			n.Status.Addr = a
			out = append(out, n)
		}
		json.NewEncoder(w).Encode(out)
	}
}
