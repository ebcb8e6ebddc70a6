package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// fakeBackend records calls and answers with err.
type fakeBackend struct {
	mu      sync.Mutex
	state   []driver.NetworkState
	err     error
	added   []addCall
	deleted [][2]string
	panics  bool
}

type addCall struct {
	nid string
	p   peerdb.Peer
}

func (f *fakeBackend) State() []driver.NetworkState {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics {
		panic("boom")
	}
	return f.state
}

func (f *fakeBackend) AddPeer(nid string, p peerdb.Peer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics {
		panic("boom")
	}
	f.added = append(f.added, addCall{nid, p})
	return f.err
}

func (f *fakeBackend) DeletePeer(nid, eid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, [2]string{nid, eid})
	return f.err
}

func (f *fakeBackend) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.added) + len(f.deleted)
}

var testPeer = peerdb.Peer{
	EndpointID: "ep1",
	IPs:        []netip.Addr{netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("2001:db8::5")},
	MAC:        hwaddr.MAC{0x02, 0x42, 0, 0, 0, 5},
	VTEP:       netip.MustParseAddr("198.51.100.2"),
}

const testPeerJSON = `{"endpointID":"ep1","ips":["203.0.113.5","2001:db8::5"],"mac":"02:42:00:00:00:05","vtep":"198.51.100.2"}`

type result struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, h http.Handler, method, path, body string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return result{rec.Code, rec.Header(), rec.Body.String()}
}

// errorOf decodes a JSON error body, failing the test on any other body.
func errorOf(t *testing.T, r result) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type = %q, want application/json", ct)
	}
	var e struct {
		Error string `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		t.Fatalf("error body %q is not {\"error\": \"...\"}: %v", r.body, err)
	}
	return e.Error
}

func TestNetworks(t *testing.T) {
	state := []driver.NetworkState{{
		ID: "n1", VNI: 300, Subnets: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
		Endpoints: []driver.EndpointState{}, Peers: []peerdb.Peer{testPeer},
	}}
	s := NewServer(&fakeBackend{state: state}, nil, nil)
	r := do(t, s, "GET", "/v1/networks", "")
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q, body %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	var got []driver.NetworkState
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "n1" || got[0].VNI != 300 || len(got[0].Peers) != 1 || got[0].Peers[0].MAC != testPeer.MAC {
		t.Errorf("got %+v", got)
	}

	// No networks is an empty list, not null.
	r = do(t, NewServer(&fakeBackend{}, nil, nil), "GET", "/v1/networks", "")
	if r.status != 200 || strings.TrimSpace(r.body) != "[]" {
		t.Errorf("empty state: status %d body %q, want 200 []", r.status, r.body)
	}
}

func TestAddPeer(t *testing.T) {
	f := &fakeBackend{}
	s := NewServer(f, nil, nil)
	r := do(t, s, "POST", "/v1/networks/n1/peers", testPeerJSON)
	if r.status != http.StatusNoContent || r.body != "" {
		t.Fatalf("status %d body %q, want 204 and no body", r.status, r.body)
	}
	if len(f.added) != 1 || f.added[0].nid != "n1" {
		t.Fatalf("calls %+v", f.added)
	}
	p := f.added[0].p
	if p.EndpointID != testPeer.EndpointID || p.MAC != testPeer.MAC || p.VTEP != testPeer.VTEP ||
		len(p.IPs) != 2 || p.IPs[0] != testPeer.IPs[0] || p.IPs[1] != testPeer.IPs[1] || p.Local {
		t.Errorf("backend got %+v, want %+v", p, testPeer)
	}
}

func TestDeletePeer(t *testing.T) {
	f := &fakeBackend{}
	s := NewServer(f, nil, nil)
	r := do(t, s, "DELETE", "/v1/networks/n1/peers/ep1", "")
	if r.status != http.StatusNoContent {
		t.Fatalf("status %d body %q, want 204", r.status, r.body)
	}
	if len(f.deleted) != 1 || f.deleted[0] != [2]string{"n1", "ep1"} {
		t.Errorf("calls %+v", f.deleted)
	}
}

func TestErrorMapping(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("%w: bad MAC", driver.ErrInvalid), 400},
		{fmt.Errorf("network n1: %w", driver.ErrNotFound), 404},
		{fmt.Errorf("%w: endpoint is local", driver.ErrConflict), 409},
		{fmt.Errorf("shutting down: %w", ErrUnavailable), 503},
		{errors.New("netlink: no buffer space"), 500},
	}
	for _, c := range cases {
		f := &fakeBackend{err: c.err}
		s := NewServer(f, nil, nil)
		for _, req := range []struct{ method, path, body string }{
			{"POST", "/v1/networks/n1/peers", testPeerJSON},
			{"DELETE", "/v1/networks/n1/peers/ep1", ""},
		} {
			r := do(t, s, req.method, req.path, req.body)
			if r.status != c.want {
				t.Errorf("%s %s with backend error %q: status %d, want %d", req.method, req.path, c.err, r.status, c.want)
				continue
			}
			if msg := errorOf(t, r); msg != c.err.Error() {
				t.Errorf("%s %s: error %q, want %q", req.method, req.path, msg, c.err)
			}
		}
	}
}

func TestBadBodies(t *testing.T) {
	cases := []struct {
		name, body string
		status     int
		want       string // in the message
	}{
		{"empty", "", 400, "empty body"},
		{"not JSON", "hello", 400, "malformed JSON"},
		{"truncated", `{"endpointID":"ep1",`, 400, "malformed JSON"},
		{"wrong type", `{"endpointID":5}`, 400, "endpointID"},
		{"bad IP", `{"endpointID":"e","ips":["300.1.1.1"]}`, 400, "malformed JSON"},
		{"bad MAC", `{"endpointID":"e","mac":"zz"}`, 400, "MAC"},
		{"unknown field", `{"endpointID":"e","vni":5}`, 400, `unknown field "vni"`},
		{"two values", testPeerJSON + testPeerJSON, 400, "after the JSON value"},
		{"array", `[` + testPeerJSON + `]`, 400, "malformed JSON"},
		{"null", `null`, 0, ""}, // decodes to the zero peer: the backend judges it
		{"oversize", `{"endpointID":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "larger than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeBackend{}
			r := do(t, NewServer(f, nil, nil), "POST", "/v1/networks/n1/peers", c.body)
			if c.status == 0 {
				return
			}
			if r.status != c.status {
				t.Fatalf("status %d body %q, want %d", r.status, r.body, c.status)
			}
			if msg := errorOf(t, r); !strings.Contains(msg, c.want) {
				t.Errorf("message %q does not mention %q", msg, c.want)
			}
			if f.calls() != 0 {
				t.Errorf("backend was called for a bad body")
			}
		})
	}
}

func TestWrongMethodAndPath(t *testing.T) {
	f := &fakeBackend{}
	s := NewServer(f, nil, nil)
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{"POST", "/v1/networks", 405, "GET, HEAD"},
		{"DELETE", "/v1/networks", 405, "GET, HEAD"},
		{"GET", "/v1/networks/n1/peers", 405, "POST"},
		{"PUT", "/v1/networks/n1/peers", 405, "POST"},
		{"GET", "/v1/networks/n1/peers/ep1", 405, "DELETE"},
		{"POST", "/v1/networks/n1/peers/ep1", 405, "DELETE"},
		{"POST", "/healthz", 405, "GET, HEAD"},
		{"GET", "/v2/networks", 404, ""},
		{"GET", "/v1/networks/n1", 404, ""},
		{"DELETE", "/v1/networks/n1/peers/", 404, ""},
		{"GET", "/", 404, ""},
	}
	for _, c := range cases {
		r := do(t, s, c.method, c.path, "")
		if r.status != c.status {
			t.Errorf("%s %s: status %d, want %d", c.method, c.path, r.status, c.status)
			continue
		}
		if got := r.header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		errorOf(t, r)
	}
	if f.calls() != 0 {
		t.Errorf("backend called %d times", f.calls())
	}
}

func TestHealthzAndReadiness(t *testing.T) {
	var mu sync.Mutex
	ready := false
	f := &fakeBackend{}
	s := NewServer(f, func() bool { mu.Lock(); defer mu.Unlock(); return ready }, nil)

	r := do(t, s, "GET", "/healthz", "")
	if r.status != 503 {
		t.Errorf("healthz before ready: %d, want 503", r.status)
	}
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/networks", ""},
		{"POST", "/v1/networks/n1/peers", testPeerJSON},
		{"DELETE", "/v1/networks/n1/peers/ep1", ""},
	} {
		r := do(t, s, req.method, req.path, req.body)
		if r.status != 503 {
			t.Errorf("%s %s before ready: %d, want 503", req.method, req.path, r.status)
		}
		errorOf(t, r)
	}
	if f.calls() != 0 {
		t.Errorf("backend called before ready")
	}

	mu.Lock()
	ready = true
	mu.Unlock()
	r = do(t, s, "GET", "/healthz", "")
	if r.status != 200 || strings.TrimSpace(r.body) != "ok" {
		t.Errorf("healthz when ready: %d %q, want 200 ok", r.status, r.body)
	}
}

func TestBackendPanic(t *testing.T) {
	s := NewServer(&fakeBackend{panics: true}, nil, nil)
	r := do(t, s, "POST", "/v1/networks/n1/peers", testPeerJSON)
	if r.status != 500 {
		t.Fatalf("status %d, want 500", r.status)
	}
	errorOf(t, r)
}
