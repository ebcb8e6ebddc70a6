package dockerengine

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// The engine socket is root on the host: nothing but a GET leaves the
// client, whichever way the request is made.
func TestOnlyGETReachesTheEngine(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Write([]byte(`{}`))
	}))
	srv.Listener = l
	srv.Start()
	defer srv.Close()

	c := New(sock)
	defer c.Close()
	var v struct{}
	if err := c.GetJSON(context.Background(), "/info", &v); err != nil {
		t.Fatalf("GET: %v", err)
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead, http.MethodPatch} {
		req, _ := http.NewRequest(m, "http://docker/containers/x/kill", strings.NewReader("{}"))
		resp, err := c.http.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s went through", m)
		}
		if !strings.Contains(err.Error(), "refused: the plugin only reads") {
			t.Fatalf("%s: %v", m, err)
		}
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("the engine got %d requests, want the GET only", n)
	}
}
