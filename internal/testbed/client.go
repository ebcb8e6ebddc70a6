package testbed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	api "github.com/docker/go-plugins-helpers/network"
)

// CallTimeout bounds one request to a plugin socket.
const CallTimeout = 30 * time.Second

// PluginContentType is what dockerd sends to and expects from plugins.
const PluginContentType = "application/vnd.docker.plugins.v1.1+json"

// NodeDiscovery is libnetwork's driverapi.NodeDiscoveryType.
const NodeDiscovery = 1

func unixHTTPClient(socket string) *http.Client {
	return &http.Client{
		Timeout: CallTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives: true,
		},
	}
}

// PluginError is a call the plugin answered with an error.
type PluginError struct {
	Path   string
	Status int
	// Err is the plugin's {"Err": ...} message, or the raw body.
	Err string
}

func (e *PluginError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.Path, e.Status, e.Err)
}

// Client speaks Docker's remote network driver protocol to a plugin socket,
// the way dockerd does: JSON POSTs, errors as non-2xx with {"Err": ...}.
type Client struct {
	Socket string
	hc     *http.Client
}

// NewClient returns a client of the plugin API socket.
func NewClient(socket string) *Client {
	return &Client{Socket: socket, hc: unixHTTPClient(socket)}
}

// Call POSTs req as JSON to path and decodes the response into resp (if
// not nil).
func (c *Client) Call(path string, req, resp any) error {
	var body bytes.Buffer
	if req == nil {
		req = struct{}{}
	}
	if err := json.NewEncoder(&body).Encode(req); err != nil {
		return fmt.Errorf("%s: encode request: %w", path, err)
	}
	hreq, err := http.NewRequest(http.MethodPost, "http://plugin"+path, &body)
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", PluginContentType)
	hreq.Header.Set("Accept", PluginContentType)
	hresp, err := c.hc.Do(hreq)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer hresp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(hresp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s: read response: %w", path, err)
	}
	if hresp.StatusCode/100 != 2 {
		var er api.ErrorResponse
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &er) == nil && er.Err != "" {
			msg = er.Err
		}
		return &PluginError{Path: path, Status: hresp.StatusCode, Err: msg}
	}
	// dockerd also rejects a success that carries an Err.
	var er api.ErrorResponse
	if json.Unmarshal(data, &er) == nil && er.Err != "" {
		return &PluginError{Path: path, Status: hresp.StatusCode, Err: er.Err}
	}
	if resp != nil {
		if err := json.Unmarshal(data, resp); err != nil {
			return fmt.Errorf("%s: decode response %q: %w", path, data, err)
		}
	}
	return nil
}

func (c *Client) Capabilities() (*api.CapabilitiesResponse, error) {
	var r api.CapabilitiesResponse
	return &r, c.Call("/NetworkDriver.GetCapabilities", nil, &r)
}

func (c *Client) AllocateNetwork(req *api.AllocateNetworkRequest) (*api.AllocateNetworkResponse, error) {
	var r api.AllocateNetworkResponse
	return &r, c.Call("/NetworkDriver.AllocateNetwork", req, &r)
}

func (c *Client) FreeNetwork(req *api.FreeNetworkRequest) error {
	return c.Call("/NetworkDriver.FreeNetwork", req, nil)
}

func (c *Client) CreateNetwork(req *api.CreateNetworkRequest) error {
	return c.Call("/NetworkDriver.CreateNetwork", req, nil)
}

func (c *Client) DeleteNetwork(req *api.DeleteNetworkRequest) error {
	return c.Call("/NetworkDriver.DeleteNetwork", req, nil)
}

func (c *Client) CreateEndpoint(req *api.CreateEndpointRequest) (*api.CreateEndpointResponse, error) {
	var r api.CreateEndpointResponse
	return &r, c.Call("/NetworkDriver.CreateEndpoint", req, &r)
}

func (c *Client) DeleteEndpoint(req *api.DeleteEndpointRequest) error {
	return c.Call("/NetworkDriver.DeleteEndpoint", req, nil)
}

func (c *Client) EndpointInfo(req *api.InfoRequest) (*api.InfoResponse, error) {
	var r api.InfoResponse
	return &r, c.Call("/NetworkDriver.EndpointOperInfo", req, &r)
}

func (c *Client) Join(req *api.JoinRequest) (*api.JoinResponse, error) {
	var r api.JoinResponse
	return &r, c.Call("/NetworkDriver.Join", req, &r)
}

func (c *Client) Leave(req *api.LeaveRequest) error {
	return c.Call("/NetworkDriver.Leave", req, nil)
}

func (c *Client) DiscoverNew(req *api.DiscoveryNotification) error {
	return c.Call("/NetworkDriver.DiscoverNew", req, nil)
}

func (c *Client) DiscoverDelete(req *api.DiscoveryNotification) error {
	return c.Call("/NetworkDriver.DiscoverDelete", req, nil)
}

// NodeDiscoveryData is what dockerd sends with a NodeDiscovery notification.
type NodeDiscoveryData struct {
	Address     string
	BindAddress string
	Self        bool
}

// DiscoverNode sends the node discovery notification dockerd sends for this
// node (self) or another swarm node.
func (c *Client) DiscoverNode(addr string, self bool) error {
	bind := ""
	if self {
		bind = addr
	}
	return c.DiscoverNew(&api.DiscoveryNotification{DiscoveryType: NodeDiscovery,
		DiscoveryData: NodeDiscoveryData{Address: addr, BindAddress: bind, Self: self}})
}

// CreateNetworkRequest is what dockerd sends every node for a swarm network:
// the leader's AllocateNetwork options under the generic key, and the IPAM
// pools with their gateways ("addr/len"). An invalid pool6 leaves IPv6 off.
func CreateNetworkRequest(networkID string, allocated map[string]string, pool4 netip.Prefix, gw4 string, pool6 netip.Prefix, gw6 string) *api.CreateNetworkRequest {
	generic := map[string]any{}
	for k, v := range allocated {
		generic[k] = v
	}
	req := &api.CreateNetworkRequest{NetworkID: networkID,
		Options:  map[string]any{"com.docker.network.generic": generic},
		IPv4Data: []*api.IPAMData{{AddressSpace: "GlobalDefault", Pool: pool4.String(), Gateway: gw4}}}
	if pool6.IsValid() {
		req.Options["com.docker.network.enable_ipv6"] = true
		req.IPv6Data = []*api.IPAMData{{AddressSpace: "GlobalDefault", Pool: pool6.String(), Gateway: gw6}}
	}
	return req
}
