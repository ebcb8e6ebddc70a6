// Package adminapi is the plugin's internal HTTP API, served on a unix
// socket: operators inspect the driver's state through it, and remote peers
// are fed to the driver through it until the gossip control plane exists.
//
// Routes:
//
//	GET    /v1/networks                              200 []driver.NetworkState
//	POST   /v1/networks/{network}/peers              body peerdb.Peer, 204
//	DELETE /v1/networks/{network}/peers/{endpoint}   204
//	GET    /healthz                                  200 "ok" when ready, else 503
//	GET    /v1/cluster                               200 gossip members and stats
//	GET    /v1/encryption                            200 key generations, hosts, SAs
//	POST   /v1/encryption/rotate                     204 start a new key generation
//	POST   /v1/secrets/reload                        204 read the secret file now
//
// The last five need a backend that implements Inspector; without the
// control plane or a cluster secret they answer 404.
//
// Errors are JSON {"error": "..."} with 400 (invalid request, malformed or
// unknown JSON), 404 (no such network), 409 (conflict), 405 (wrong method),
// 413 (body too large), 503 (driver not ready or shutting down) and 500
// otherwise.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/pluginapi"
)

// MaxBodyBytes bounds a request body. A peer is a few hundred bytes.
const MaxBodyBytes = 64 << 10

// ErrUnavailable marks an error of a backend that cannot serve now (not yet
// ready, or shutting down); the server answers 503. It is the plugin API's
// gate's, which refuses the calls of both APIs alike.
var ErrUnavailable = pluginapi.ErrUnavailable

// Backend is what the server exposes; *driver.Driver implements it.
type Backend interface {
	State() []driver.NetworkState
	AddPeer(networkID string, p peerdb.Peer) error
	DeletePeer(networkID, endpointID string) error
}

// Inspector is what a backend with a control plane adds. Its methods
// return errors wrapping driver.ErrNotFound when the part is not running.
type Inspector interface {
	Cluster() (any, error)
	Encryption() (any, error)
	RotateKeys() error
	// ReloadSecrets reads the secret file now; an error wrapping
	// driver.ErrInvalid is a file it refused (its secrets stay in use).
	ReloadSecrets(ctx context.Context) error
	// Check is what `overlay-plugin check` prints (a check.Report).
	Check() (any, error)
}

// Server is the admin API's http.Handler.
type Server struct {
	backend Backend
	ready   func() bool
	log     *slog.Logger
	mux     *http.ServeMux
}

// NewServer serves backend. ready reports whether the backend can take
// calls; while it returns false, /healthz answers 503 and every /v1 route
// 503 without calling the backend. A nil ready means always ready; a nil
// log discards.
func NewServer(backend Backend, ready func() bool, log *slog.Logger) *Server {
	if ready == nil {
		ready = func() bool { return true }
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{backend: backend, ready: ready, log: log, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /v1/networks", s.networks)
	s.mux.HandleFunc("POST /v1/networks/{network}/peers", s.addPeer)
	s.mux.HandleFunc("DELETE /v1/networks/{network}/peers/{endpoint}", s.deletePeer)
	if in, ok := backend.(Inspector); ok {
		s.mux.HandleFunc("GET /v1/cluster", s.inspect(in.Cluster))
		s.mux.HandleFunc("GET /v1/encryption", s.inspect(in.Encryption))
		s.mux.HandleFunc("GET /v1/check", s.inspect(in.Check))
		s.mux.HandleFunc("POST /v1/encryption/rotate", func(w http.ResponseWriter, r *http.Request) {
			if s.checkReady(w) {
				s.finish(w, r, in.RotateKeys())
			}
		})
		s.mux.HandleFunc("POST /v1/secrets/reload", func(w http.ResponseWriter, r *http.Request) {
			if s.checkReady(w) {
				s.finish(w, r, in.ReloadSecrets(r.Context()))
			}
		})
		s.mux.HandleFunc("/v1/secrets/reload", methodNotAllowed("POST"))
		s.mux.HandleFunc("/v1/cluster", methodNotAllowed("GET, HEAD"))
		s.mux.HandleFunc("/v1/encryption", methodNotAllowed("GET, HEAD"))
		s.mux.HandleFunc("/v1/check", methodNotAllowed("GET, HEAD"))
		s.mux.HandleFunc("/v1/encryption/rotate", methodNotAllowed("POST"))
	}
	// The same paths without a method catch every other method, so that a
	// wrong method gets a JSON 405 rather than the mux's plain text.
	s.mux.HandleFunc("/healthz", methodNotAllowed("GET, HEAD"))
	s.mux.HandleFunc("/v1/networks", methodNotAllowed("GET, HEAD"))
	s.mux.HandleFunc("/v1/networks/{network}/peers", methodNotAllowed("POST"))
	s.mux.HandleFunc("/v1/networks/{network}/peers/{endpoint}", methodNotAllowed("DELETE"))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		// A panic in the backend must not take the plugin down with it:
		// net/http would recover it but drop the connection without an
		// answer. ErrAbortHandler is net/http's own, passed through.
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("admin API handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v)
			writeError(w, http.StatusInternalServerError, "internal error")
		}
	}()
	s.mux.ServeHTTP(w, r)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.ready() {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready\n")
		return
	}
	io.WriteString(w, "ok\n")
}

func (s *Server) networks(w http.ResponseWriter, r *http.Request) {
	if !s.checkReady(w) {
		return
	}
	state := s.backend.State()
	if state == nil {
		state = []driver.NetworkState{}
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(state); err != nil {
		s.log.Warn("admin API write response", "err", err)
	}
}

// inspect serves a read-only JSON view.
func (s *Server) inspect(f func() (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.checkReady(w) {
			return
		}
		v, err := f()
		if err != nil {
			writeError(w, StatusOf(err), err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(v); err != nil {
			s.log.Warn("admin API write response", "err", err)
		}
	}
}

func (s *Server) addPeer(w http.ResponseWriter, r *http.Request) {
	if !s.checkReady(w) {
		return
	}
	var p peerdb.Peer
	if status, err := decodeBody(w, r, &p); err != nil {
		writeError(w, status, err.Error())
		return
	}
	nid := r.PathValue("network")
	err := s.backend.AddPeer(nid, p)
	s.finish(w, r, err, "network", nid, "endpoint", p.EndpointID)
}

func (s *Server) deletePeer(w http.ResponseWriter, r *http.Request) {
	if !s.checkReady(w) {
		return
	}
	nid, eid := r.PathValue("network"), r.PathValue("endpoint")
	err := s.backend.DeletePeer(nid, eid)
	s.finish(w, r, err, "network", nid, "endpoint", eid)
}

// finish answers 204 or the error, and logs the outcome.
func (s *Server) finish(w http.ResponseWriter, r *http.Request, err error, attrs ...any) {
	if err != nil {
		status := StatusOf(err)
		s.log.Info("admin API call failed", append([]any{"method", r.Method, "path", r.URL.Path, "status", status, "err", err}, attrs...)...)
		writeError(w, status, err.Error())
		return
	}
	s.log.Info("admin API call", append([]any{"method", r.Method, "path", r.URL.Path}, attrs...)...)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) checkReady(w http.ResponseWriter) bool {
	if s.ready() {
		return true
	}
	writeError(w, http.StatusServiceUnavailable, "the driver is not ready (starting up or shutting down)")
	return false
}

// StatusOf maps a backend error to its HTTP status.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, driver.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, driver.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, driver.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// decodeBody decodes exactly one JSON value with no unknown fields from a
// bounded body. On failure it returns the status to answer.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Anything after the value is an error too: one request, one value.
		if _, err2 := dec.Token(); err2 != io.EOF {
			err = errors.New("unexpected data after the JSON value")
		}
	}
	if err == nil {
		return 0, nil
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("request body larger than %d bytes", tooBig.Limit)
	}
	if errors.Is(err, io.EOF) {
		return http.StatusBadRequest, errors.New("malformed JSON request body: empty body")
	}
	return http.StatusBadRequest, fmt.Errorf("malformed JSON request body: %v", err)
}

// errorBody is every error response's body.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBody{Error: msg})
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed,
			fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.ReplaceAll(allow, ", ", " or ")))
	}
}
