package pluginapitest

// GenericKey is where Docker puts a network's driver options (-o) in
// CreateNetwork.
const GenericKey = "com.docker.network.generic"

// CreateNetwork is a CreateNetwork request as Docker sends it: opts under
// GenericKey, one IPv4 pool per entry of pools.
func CreateNetwork(nid string, opts map[string]string, pools ...string) map[string]any {
	generic := map[string]any{}
	for k, v := range opts {
		generic[k] = v
	}
	var v4 []map[string]any
	for _, p := range pools {
		v4 = append(v4, map[string]any{"AddressSpace": "GlobalDefault", "Pool": p, "Gateway": ""})
	}
	return map[string]any{"NetworkID": nid, "Options": map[string]any{GenericKey: generic,
		"com.docker.network.enable_ipv6": false}, "IPv4Data": v4, "IPv6Data": nil}
}
