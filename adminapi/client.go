package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/overlay-plugin/overlay-plugin/check"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// DefaultTimeout bounds one client call.
const DefaultTimeout = 30 * time.Second

// Client calls the admin API on a unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the admin socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:    1,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{socket: path, http: &http.Client{Transport: tr, Timeout: DefaultTimeout}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Error is an error answer of the server. errors.Is matches it against
// driver.ErrInvalid, ErrNotFound, ErrConflict and ErrUnavailable by status.
type Error struct {
	StatusCode int
	Message    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("admin API: %s (HTTP %d)", e.Message, e.StatusCode)
}

func (e *Error) Unwrap() error {
	switch e.StatusCode {
	case http.StatusBadRequest:
		return driver.ErrInvalid
	case http.StatusNotFound:
		return driver.ErrNotFound
	case http.StatusConflict:
		return driver.ErrConflict
	case http.StatusServiceUnavailable:
		return ErrUnavailable
	}
	return nil
}

// Networks returns the driver's state.
func (c *Client) Networks() ([]driver.NetworkState, error) {
	var out []driver.NetworkState
	if err := c.do(http.MethodGet, "/v1/networks", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// AddPeer adds or replaces a remote endpoint of a network.
func (c *Client) AddPeer(networkID string, p peerdb.Peer) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return c.do(http.MethodPost, "/v1/networks/"+url.PathEscape(networkID)+"/peers", body, nil)
}

// DeletePeer removes a remote endpoint of a network.
func (c *Client) DeletePeer(networkID, endpointID string) error {
	return c.do(http.MethodDelete, "/v1/networks/"+url.PathEscape(networkID)+"/peers/"+url.PathEscape(endpointID), nil, nil)
}

// Cluster returns the gossip members and statistics as JSON.
func (c *Client) Cluster() (json.RawMessage, error) {
	var out json.RawMessage
	err := c.do(http.MethodGet, "/v1/cluster", nil, &out)
	return out, err
}

// Encryption returns the IPsec status as JSON.
func (c *Client) Encryption() (json.RawMessage, error) {
	var out json.RawMessage
	err := c.do(http.MethodGet, "/v1/encryption", nil, &out)
	return out, err
}

// Check is the plugin's check of this host and its peers.
func (c *Client) Check() (check.Report, error) {
	var out check.Report
	err := c.do(http.MethodGet, "/v1/check", nil, &out)
	return out, err
}

// RotateKeys starts a new key generation now.
func (c *Client) RotateKeys() error {
	return c.do(http.MethodPost, "/v1/encryption/rotate", nil, nil)
}

// ReloadSecrets asks the plugin to read its secret file now.
func (c *Client) ReloadSecrets() error {
	return c.do(http.MethodPost, "/v1/secrets/reload", nil, nil)
}

// Healthy reports whether the plugin's driver is ready. The error is for a
// plugin that cannot be reached or answers nonsense.
func (c *Client) Healthy() (bool, error) {
	req, err := http.NewRequest(http.MethodGet, "http://admin/healthz", nil)
	if err != nil {
		return false, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, c.wrap(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusServiceUnavailable:
		return false, nil
	}
	return false, fmt.Errorf("admin API: /healthz answered HTTP %d", resp.StatusCode)
}

func (c *Client) do(method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://admin"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return c.wrap(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API: read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e errorBody
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
			if e.Error == "" {
				e.Error = http.StatusText(resp.StatusCode)
			}
		}
		return &Error{StatusCode: resp.StatusCode, Message: e.Error}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("admin API: decode response: %w", err)
		}
	}
	return nil
}

// wrap explains a transport error in terms of the socket.
func (c *Client) wrap(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("admin API at %s: %w (is the plugin running, and is this its admin socket?)", c.socket, err)
}
