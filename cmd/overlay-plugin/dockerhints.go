package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// A plugin enabled on an existing swarm hears DiscoverNew only for its own
// node: Docker announces the other nodes to a plugin only when they join.
// With the Docker socket at hand (--docker-socket), the plugin asks the
// engine instead: every node knows its managers (GET /info), and a manager
// knows every node (GET /nodes). Those addresses become gossip hints;
// joining any live member is enough, gossip does the rest.

// swarmAddrs lists the addresses of swarm nodes the local engine knows:
// the managers from /info, and every node from /nodes where /info says this
// node is a manager (Swarm.ControlAvailable). A worker's engine answers
// /nodes with 503 and logs it as an error, twice, every time it is asked.
func swarmAddrs(ctx context.Context, c *http.Client) ([]netip.Addr, error) {
	var info struct {
		Swarm struct {
			ControlAvailable bool
			RemoteManagers   []struct{ Addr string }
		}
	}
	if err := getJSON(ctx, c, "/info", &info); err != nil {
		return nil, err
	}
	var out []netip.Addr
	add := func(hostport string) {
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			host = hostport
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, a.Unmap())
		}
	}
	for _, m := range info.Swarm.RemoteManagers {
		add(m.Addr)
	}
	if !info.Swarm.ControlAvailable {
		return out, nil
	}
	var nodes []struct {
		Status struct{ Addr string }
	}
	if err := getJSON(ctx, c, "/nodes", &nodes); err != nil {
		return out, err
	}
	for _, n := range nodes {
		add(n.Status.Addr)
	}
	return out, nil
}

func getJSON(ctx context.Context, c *http.Client, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("docker %s: HTTP %d", path, resp.StatusCode)
	}
	return json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 16<<20)).Decode(v)
}

// hintFromDocker passes the swarm's node addresses to hint now and every
// period until ctx ends.
func hintFromDocker(ctx context.Context, socket string, period time.Duration, hint func(netip.Addr), log *slog.Logger) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}}}
	defer c.CloseIdleConnections()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		addrs, err := swarmAddrs(ctx, c) // what it has, even with an error
		if err != nil {
			log.Debug("ask Docker for the swarm's nodes", "socket", socket, "err", err)
		}
		for _, a := range addrs {
			hint(a)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
