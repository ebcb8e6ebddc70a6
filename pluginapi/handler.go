// Package pluginapi serves Docker's remote network driver API: a plain
// http.Handler that decodes each call into go-plugins-helpers' request
// type, admits it through a Gate and answers the driver's result or
// {"Err": "..."}. Every refusal is worded for the operator who reads it in
// Docker's error: a malformed body, an unknown call, a wrong method.
package pluginapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	api "github.com/docker/go-plugins-helpers/network"
)

// MaxBody bounds a request from Docker; the largest (CreateNetwork with
// its IPAM data and options) is a few kilobytes.
const MaxBody = 1 << 20

// ContentType is what Docker's plugin protocol answers with.
const ContentType = "application/vnd.docker.plugins.v1.1+json"

// manifest is the answer to /Plugin.Activate.
const manifest = `{"Implements": ["NetworkDriver"]}`

// Handler serves the network driver API over the driver behind a gate.
type Handler[D api.Driver] struct {
	log    *slog.Logger
	routes map[string]route[D]
}

// NewHandler serves Docker's calls on the driver g admits.
func NewHandler[D api.Driver](g *Gate[D], log *slog.Logger) *Handler[D] {
	return &Handler[D]{log: log, routes: routes(g)}
}

// route serves one call: body is the whole request body. A failure is an
// error answer with status.
type route[D api.Driver] func(path string, body []byte) (res any, status int, err error)

func (h *Handler[D]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		h.reject(w, r, http.StatusMethodNotAllowed, fmt.Errorf("%s: method %s; the plugin API takes POST", r.URL.Path, r.Method))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		status := http.StatusBadRequest
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			status = http.StatusRequestEntityTooLarge
			err = fmt.Errorf("request body larger than %d bytes", tooBig.Limit)
		}
		h.reject(w, r, status, fmt.Errorf("%s: %w", r.URL.Path, err))
		return
	}
	if r.URL.Path == "/Plugin.Activate" {
		w.Header().Set("Content-Type", ContentType)
		fmt.Fprintln(w, manifest)
		return
	}
	serve, ok := h.routes[r.URL.Path]
	if !ok {
		h.reject(w, r, http.StatusNotFound, fmt.Errorf("%s is not a call of the network driver API", r.URL.Path))
		return
	}
	res, status, err := serve(r.URL.Path, body)
	if err != nil {
		h.reject(w, r, status, err)
		return
	}
	w.Header().Set("Content-Type", ContentType)
	json.NewEncoder(w).Encode(res)
}

// reject answers {"Err": msg} as Docker expects, and logs it. A driver's
// own failure is logged by the gate already.
func (h *Handler[D]) reject(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status != http.StatusInternalServerError {
		h.log.Warn("plugin API request rejected", "path", r.URL.Path, "status", status, "err", err)
	}
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.NewErrorResponse(err.Error()))
}

// decode reads body, one JSON value and nothing after it, into req.
func decode(path string, body []byte, req any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: empty request body, want a JSON object", path)
		}
		return fmt.Errorf("%s: malformed JSON request: %v", path, err)
	}
	if rest := bytes.TrimSpace(body[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("%s: %d bytes of trailing data after the JSON request", path, len(rest))
	}
	if err := json.Unmarshal(raw, req); err != nil {
		return fmt.Errorf("%s: malformed JSON request: %v", path, err)
	}
	return nil
}
