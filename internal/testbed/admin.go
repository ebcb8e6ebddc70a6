package testbed

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// AdminGet GETs path (e.g. "/v1/cluster") on the plugin's admin socket and
// returns the body. A status other than 2xx is an error carrying the body.
// For views the typed adminapi.Client does not decode, and for dumping the
// raw JSON when a test fails.
func (p *Plugin) AdminGet(path string) ([]byte, error) {
	hc := unixHTTPClient(p.AdminSocket)
	resp, err := hc.Get("http://admin" + path)
	if err != nil {
		return nil, fmt.Errorf("admin GET %s on %s: %w", path, p.Host.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("admin GET %s on %s: read: %w", path, p.Host.Name, err)
	}
	if resp.StatusCode/100 != 2 {
		return body, fmt.Errorf("admin GET %s on %s: HTTP %d: %s", path, p.Host.Name, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// AdminJSON GETs path on the admin socket and decodes the JSON body into v.
func (p *Plugin) AdminJSON(path string, v any) error {
	body, err := p.AdminGet(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("admin GET %s on %s: decode: %w: %.300s", path, p.Host.Name, err, body)
	}
	return nil
}
