package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	api "github.com/docker/go-plugins-helpers/network"
)

// maxPluginBody bounds a request from Docker; the largest (CreateNetwork
// with its IPAM data and options) is a few kilobytes.
const maxPluginBody = 1 << 20

// pluginContentType is what go-plugins-helpers answers with.
const pluginContentType = "application/vnd.docker.plugins.v1.1+json"

// pluginAPI serves Docker's remote network driver API. The protocol itself
// is go-plugins-helpers' network.NewHandler, but that handler exposes only
// Serve(listener), not an http.Handler, and answers a request it cannot
// decode with a plain-text 400. So it is served on a private in-memory
// listener, and pluginAPI is the http.Handler in front of it (on the real
// unix socket, under our own http.Server with a graceful Shutdown): it
// bounds the request body and turns every error answer that is not already
// {"Err": "..."} into one, so Docker always gets a clear message.
type pluginAPI struct {
	log    *slog.Logger
	inner  *pipeListener
	client *http.Client
	done   chan struct{} // closed when the inner Serve has returned
}

func newPluginAPI(d api.Driver, log *slog.Logger) *pluginAPI {
	inner := newPipeListener()
	p := &pluginAPI{
		log:   log,
		inner: inner,
		client: &http.Client{Transport: &http.Transport{
			DialContext:         inner.DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}},
		done: make(chan struct{}),
	}
	h := api.NewHandler(d)
	go func() {
		defer close(p.done)
		h.Serve(inner) // returns when inner is closed
	}()
	return p
}

// Close stops the inner server. Call it after the outer server has shut
// down: requests still being forwarded fail.
func (p *pluginAPI) Close() {
	p.inner.Close()
	p.client.CloseIdleConnections()
	<-p.done
}

func (p *pluginAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		p.reject(w, r, http.StatusMethodNotAllowed, fmt.Sprintf("%s: method %s; the plugin API takes POST", r.URL.Path, r.Method))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPluginBody))
	if err != nil {
		status := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			status = http.StatusRequestEntityTooLarge
			err = fmt.Errorf("request body larger than %d bytes", tooBig.Limit)
		}
		p.reject(w, r, status, fmt.Sprintf("%s: %v", r.URL.Path, err))
		return
	}
	if rest := afterJSON(body); len(rest) > 0 {
		p.reject(w, r, http.StatusBadRequest, fmt.Sprintf("%s: %d bytes of trailing data after the JSON request", r.URL.Path, len(rest)))
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, "http://plugin"+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		p.reject(w, r, http.StatusBadRequest, fmt.Sprintf("%s: %v", r.URL.Path, err))
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// The inner handler died (a panic) or the server is closing.
		p.reject(w, r, http.StatusInternalServerError, fmt.Sprintf("%s: overlay plugin internal error: %v", r.URL.Path, err))
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		p.reject(w, r, http.StatusInternalServerError, fmt.Sprintf("%s: overlay plugin internal error: %v", r.URL.Path, err))
		return
	}
	if resp.StatusCode >= 400 && !isErrResponse(out) {
		p.reject(w, r, resp.StatusCode, explain(r, resp.StatusCode, out))
		return
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// afterJSON is what follows the first JSON value of body, whitespace
// aside: go-plugins-helpers decodes one value and ignores the rest. Nil
// when body does not start with a JSON value (the inner handler words that
// error).
func afterJSON(body []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v json.RawMessage
	if dec.Decode(&v) != nil {
		return nil
	}
	return bytes.TrimSpace(body[dec.InputOffset():])
}

// isErrResponse reports a body of the form {"Err": "non-empty"}.
func isErrResponse(b []byte) bool {
	var e api.ErrorResponse
	return json.Unmarshal(b, &e) == nil && e.Err != ""
}

// explain words an error that go-plugins-helpers answered in plain text.
func explain(r *http.Request, status int, body []byte) string {
	msg := strings.TrimSpace(string(body))
	switch {
	case status == http.StatusNotFound:
		return fmt.Sprintf("%s is not a call of the network driver API", r.URL.Path)
	case status == http.StatusBadRequest && msg == "EOF":
		return fmt.Sprintf("%s: empty request body, want a JSON object", r.URL.Path)
	case status == http.StatusBadRequest:
		return fmt.Sprintf("%s: malformed JSON request: %s", r.URL.Path, msg)
	case msg == "":
		return fmt.Sprintf("%s: %s", r.URL.Path, http.StatusText(status))
	}
	return fmt.Sprintf("%s: %s", r.URL.Path, msg)
}

// reject answers {"Err": msg} as go-plugins-helpers does, and logs it.
func (p *pluginAPI) reject(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p.log.Warn("plugin API request rejected", "path", r.URL.Path, "status", status, "err", msg)
	w.Header().Set("Content-Type", pluginContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.NewErrorResponse(msg))
}

// pipeListener is a net.Listener whose connections are in-memory pipes
// made by DialContext.
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, net.ErrClosed
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "overlay-plugin-internal" }
