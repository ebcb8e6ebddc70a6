package driver

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Network options a user passes with `docker network create --opt K=V`.
// AllocateNetwork receives them verbatim; what it returns reaches every node
// in CreateNetwork under genericOptionsKey.
const (
	// OptVNI chooses the network's VXLAN id. The name (and the long alias)
	// follow Docker's overlay; a list is accepted for familiarity but this
	// driver carries all subnets of a network on one VNI, so it must hold
	// exactly one value.
	OptVNI      = "vxlanid_list"
	optVNIAlias = "com.docker.network.driver.overlay.vxlanid_list"
	// minMTU is the smallest MTU option accepted: IPv6's minimum.
	minMTU = 1280
	// OptMTU caps the MTU of the network's interfaces (Docker's own key).
	OptMTU = "com.docker.network.driver.mtu"
	// OptEncrypted asks for IPsec; Docker sends it as "encrypted":"".
	OptEncrypted = "encrypted"
	// OptFlood turns on broadcast and multicast between hosts by head-end
	// replication: an all-zero FDB entry to every VTEP with endpoints in the
	// network. Off by default, as in Docker's overlay (libnetwork #552),
	// because every broadcast is then sent once per remote host.
	OptFlood = "flood"

	genericOptionsKey = "com.docker.network.generic"
)

// netOptions is a network's parsed options.
type netOptions struct {
	vni       uint32 // 0: not chosen
	mtu       int    // 0: from the underlay
	encrypted bool
	flood     bool
}

// parseOptions validates user options. Keys under com.docker. that this
// driver does not use are ignored (Docker adds its own); any other unknown
// key is an error, so a typo does not silently create the wrong network.
func parseOptions(opts map[string]string) (netOptions, error) {
	var o netOptions
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := opts[k]
		switch k {
		case OptVNI, optVNIAlias:
			vni, err := parseVNIList(v)
			if err != nil {
				return o, err
			}
			if o.vni != 0 && o.vni != vni {
				return o, fmt.Errorf("options %s and %s disagree (%d, %d)", OptVNI, optVNIAlias, o.vni, vni)
			}
			o.vni = vni
		case OptMTU:
			mtu, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || mtu < minMTU || mtu > 65535 {
				return o, fmt.Errorf("option %s=%q: want an MTU between %d and 65535", k, v, minMTU)
			}
			o.mtu = mtu
		case OptEncrypted:
			if v != "" && v != "true" {
				return o, fmt.Errorf("option %s=%q: give it without a value (--opt %s)", k, v, k)
			}
			o.encrypted = true
		case OptFlood:
			b, err := parseBool(v)
			if err != nil {
				return o, fmt.Errorf("option %s=%q: %v", k, v, err)
			}
			o.flood = b
		default:
			if !strings.HasPrefix(k, "com.docker.") {
				return o, fmt.Errorf("unknown network option %q (known: %s, %s, %s, %s)", k, OptVNI, OptMTU, OptEncrypted, OptFlood)
			}
		}
	}
	return o, nil
}

// parseBool reads a flag option: present without a value means true.
func parseBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off":
		return false, nil
	}
	return false, errors.New("want true or false")
}

func parseVNIList(v string) (uint32, error) {
	parts := strings.Split(v, ",")
	if len(parts) != 1 {
		return 0, fmt.Errorf("option %s=%q: this driver carries all subnets of a network on one VNI; give exactly one", OptVNI, v)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(parts[0]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("option %s=%q: not a number", OptVNI, v)
	}
	if n == 0 || n >= 1<<24 {
		return 0, fmt.Errorf("option %s=%q: a VNI is between 1 and 16777215", OptVNI, v)
	}
	return uint32(n), nil
}

// genericOptions extracts the user options from a CreateNetwork request.
func genericOptions(opts map[string]any) (map[string]string, error) {
	raw, ok := opts[genericOptionsKey]
	if !ok || raw == nil {
		return map[string]string{}, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an object of strings, got %T", genericOptionsKey, raw)
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%s[%q]: want a string, got %T", genericOptionsKey, k, v)
		}
		out[k] = s
	}
	return out, nil
}
