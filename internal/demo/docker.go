package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	api "github.com/docker/go-plugins-helpers/network"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// The overlay's address plan, as swarm's IPAM would hand it out: container
// ci gets 203.0.113.1i and 2001:db8:1::1i, alike to the eye.
var (
	pool4 = netip.MustParsePrefix("203.0.113.0/24")
	pool6 = netip.MustParsePrefix("2001:db8:1::/64")
)

const (
	gw4 = "203.0.113.254/24"
	gw6 = "2001:db8:1::fffe/64"
)

// actAsDockerd makes the calls dockerd makes: enabling the plugin on each
// node, creating a swarm network (allocated by the leader, created on every
// node) and starting one container on it per host.
func (r *run) actAsDockerd(ctx context.Context) error {
	r.out.step("Talking to the plugins like dockerd (Docker's plugin API on each plugin's socket)")
	var caps *api.CapabilitiesResponse
	for _, p := range r.plugins {
		var err error
		if caps, err = p.API.Capabilities(); err != nil {
			return fmt.Errorf("%s: %w", p.Host.Name, err)
		}
		if err := p.API.DiscoverNode(p.Host.Underlay.String(), true); err != nil {
			return fmt.Errorf("%s: %w", p.Host.Name, err)
		}
	}
	r.out.say("GetCapabilities -> %s", jsonText(caps))

	r.netID = testbed.SwarmID()
	leader := r.plugins[0]
	alloc, err := leader.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: r.netID, Options: map[string]string{},
		IPv4Data: []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: pool4.String(), Gateway: gw4}}})
	if err != nil {
		return fmt.Errorf("%s: %w", leader.Host.Name, err)
	}
	r.out.say("AllocateNetwork on %s (the swarm leader) -> options %s", leader.Host.Name, jsonText(alloc.Options))
	for _, p := range r.plugins {
		if err := p.API.CreateNetwork(testbed.CreateNetworkRequest(r.netID, alloc.Options, pool4, gw4, pool6, gw6)); err != nil {
			return fmt.Errorf("%s: %w", p.Host.Name, err)
		}
	}
	r.out.say("CreateNetwork %s on every host (%s, %s)", r.netID, pool4, pool6)

	for i, p := range r.plugins {
		if err := ctx.Err(); err != nil {
			return err
		}
		addrs := []netip.Prefix{
			netip.PrefixFrom(testbed.Nth(pool4, 11+i), pool4.Bits()),
			netip.PrefixFrom(testbed.Nth(pool6, 0x11+i), pool6.Bits()),
		}
		c, err := p.RunContainer(r.netID, fmt.Sprintf("c%d", i+1), addrs...)
		if err != nil {
			return err
		}
		r.ctrs = append(r.ctrs, c)
		r.out.say("container %s on %s: %s, %s, MAC %s (endpoint %s, veth %s)",
			c.Name, p.Host.Name, addrs[0].Addr(), addrs[1].Addr(), c.MAC, c.Endpoint.ID[:12], c.SrcName)
	}
	return nil
}

// jsonText is v as JSON, as the plugin sent it.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
