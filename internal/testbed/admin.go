package testbed

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
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

// Metric reads one series of the plugin's Prometheus metrics (GET /metrics
// on the admin socket), named as the exposition prints it, labels and all:
// `go_goroutines`, `overlay_plugin_gossip_rejected_total{reason="stream_idle"}`.
// A series the plugin does not show is an error.
func (p *Plugin) Metric(series string) (float64, error) {
	body, err := p.AdminGet("/metrics")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("metrics of %s: %q: %w", p.Host.Name, line, err)
			}
			return f, nil
		}
	}
	return 0, fmt.Errorf("metrics of %s: no series %s", p.Host.Name, series)
}

// OpenFDs counts the plugin process's open file descriptors
// (/proc/PID/fd). The process must be running.
func (p *Plugin) OpenFDs() (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid()))
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}
