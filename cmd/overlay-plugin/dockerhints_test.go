package main

import (
	"context"
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
)

// fakeDocker serves /info (and /nodes when manager) on a unix socket.
func fakeDocker(t *testing.T, manager bool) string {
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /info", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"Swarm":{"RemoteManagers":[{"NodeID":"a","Addr":"198.51.100.1:2377"},{"NodeID":"b","Addr":"[2001:db8::2]:2377"}]}}`)
	})
	mux.HandleFunc("GET /nodes", func(w http.ResponseWriter, r *http.Request) {
		if !manager {
			http.Error(w, `{"message":"This node is not a swarm manager."}`, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, `[{"Status":{"Addr":"198.51.100.1"}},{"Status":{"Addr":"198.51.100.3"}}]`)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestHintsFromDocker(t *testing.T) {
	for _, c := range []struct {
		manager bool
		want    []string
	}{
		{false, []string{"198.51.100.1", "2001:db8::2"}},
		{true, []string{"198.51.100.1", "2001:db8::2", "198.51.100.1", "198.51.100.3"}},
	} {
		sock := fakeDocker(t, c.manager)
		var mu sync.Mutex
		var got []string
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			hintFromDocker(ctx, sock, time.Hour, func(a netip.Addr) {
				mu.Lock()
				got = append(got, a.String())
				mu.Unlock()
			}, slog.New(slog.DiscardHandler))
		}()
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
			t.Errorf("manager=%v: hints %v, want %v", c.manager, got, c.want)
		}
	}
}
