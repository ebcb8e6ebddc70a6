// Package dockerengine asks the local Docker engine, over its API socket,
// what a plugin is not told: the swarm's nodes and the services of a
// network. Read-only GETs of JSON, nothing more: the socket is root on the
// host, so the client's transport refuses any other method before it
// leaves the process.
package dockerengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// maxBody bounds an answer: a network's verbose inspect lists every task
// of every service on it.
const maxBody = 16 << 20

// ErrNotFound is the engine's 404: it knows no such object.
var ErrNotFound = errors.New("not found")

// Client talks to one engine socket.
type Client struct{ http *http.Client }

// New returns a client of the engine listening on the unix socket path.
func New(socket string) *Client {
	return &Client{http: &http.Client{Timeout: 10 * time.Second, Transport: getOnly{&http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}}}}}
}

// getOnly passes GETs on and refuses every other request.
type getOnly struct{ next http.RoundTripper }

func (g getOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("docker %s %s refused: the plugin only reads from the engine", r.Method, r.URL.Path)
	}
	return g.next.RoundTrip(r)
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// GetJSON decodes the answer to GET path into v. A status other than 200
// is an error carrying the engine's message.
func (c *Client) GetJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, maxBody)
	if resp.StatusCode != http.StatusOK {
		var e struct{ Message string }
		_ = json.NewDecoder(body).Decode(&e)
		err := fmt.Errorf("docker %s: HTTP %d: %s", path, resp.StatusCode, e.Message)
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		return err
	}
	return json.NewDecoder(body).Decode(v)
}
