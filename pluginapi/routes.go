package pluginapi

import (
	"errors"
	"net/http"

	api "github.com/docker/go-plugins-helpers/network"
)

// routes are the network driver API's calls, by path, each named as
// Docker's protocol names it (the name labels logs and metrics).
func routes[D api.Driver](g *Gate[D]) map[string]route[D] {
	return map[string]route[D]{
		"/NetworkDriver.GetCapabilities": func(string, []byte) (any, int, error) {
			res, err := Call(g, "GetCapabilities", nil, D.GetCapabilities)
			if err == nil && res == nil {
				err = errors.New("network driver must implement GetCapabilities")
			}
			return answer(res, err)
		},
		"/NetworkDriver.AllocateNetwork": call(g, "AllocateNetwork", func(r *api.AllocateNetworkRequest) []any { return netAttrs(r.NetworkID) }, D.AllocateNetwork),
		"/NetworkDriver.FreeNetwork":     call(g, "FreeNetwork", func(r *api.FreeNetworkRequest) []any { return netAttrs(r.NetworkID) }, void(D.FreeNetwork)),
		"/NetworkDriver.CreateNetwork":   call(g, "CreateNetwork", func(r *api.CreateNetworkRequest) []any { return netAttrs(r.NetworkID) }, void(D.CreateNetwork)),
		"/NetworkDriver.DeleteNetwork":   call(g, "DeleteNetwork", func(r *api.DeleteNetworkRequest) []any { return netAttrs(r.NetworkID) }, void(D.DeleteNetwork)),
		"/NetworkDriver.CreateEndpoint": call(g, "CreateEndpoint", func(r *api.CreateEndpointRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) },
			D.CreateEndpoint),
		"/NetworkDriver.DeleteEndpoint": call(g, "DeleteEndpoint", func(r *api.DeleteEndpointRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) },
			void(D.DeleteEndpoint)),
		"/NetworkDriver.EndpointOperInfo": call(g, "EndpointOperInfo", func(r *api.InfoRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) },
			D.EndpointInfo),
		"/NetworkDriver.Join":  call(g, "Join", func(r *api.JoinRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) }, D.Join),
		"/NetworkDriver.Leave": call(g, "Leave", func(r *api.LeaveRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) }, void(D.Leave)),
		"/NetworkDriver.DiscoverNew": call(g, "DiscoverNew", func(n *api.DiscoveryNotification) []any { return []any{"type", n.DiscoveryType} },
			void(D.DiscoverNew)),
		"/NetworkDriver.DiscoverDelete": call(g, "DiscoverDelete", func(n *api.DiscoveryNotification) []any { return []any{"type", n.DiscoveryType} },
			void(D.DiscoverDelete)),
		"/NetworkDriver.ProgramExternalConnectivity": call(g, "ProgramExternalConnectivity",
			func(r *api.ProgramExternalConnectivityRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) }, void(D.ProgramExternalConnectivity)),
		"/NetworkDriver.RevokeExternalConnectivity": call(g, "RevokeExternalConnectivity",
			func(r *api.RevokeExternalConnectivityRequest) []any { return epAttrs(r.NetworkID, r.EndpointID) }, void(D.RevokeExternalConnectivity)),
	}
}

// call is the route of a call that takes a Req: decoded, then run on the
// driver through the gate. A malformed request is a 400 and reaches no
// driver; the driver's error is a 500, as go-plugins-helpers answers it.
func call[D api.Driver, Req, Res any](g *Gate[D], name string, attrs func(*Req) []any, f func(D, *Req) (Res, error)) route[D] {
	return func(path string, body []byte) (any, int, error) {
		req := new(Req)
		if err := decode(path, body, req); err != nil {
			return nil, http.StatusBadRequest, err
		}
		return answer(Call(g, name, attrs(req), func(d D) (Res, error) { return f(d, req) }))
	}
}

func answer[Res any](res Res, err error) (any, int, error) {
	if err != nil {
		return nil, http.StatusInternalServerError, err
	}
	return res, http.StatusOK, nil
}

// void makes a call that answers nothing answer {}.
func void[D, Req any](f func(D, *Req) error) func(D, *Req) (struct{}, error) {
	return func(d D, r *Req) (struct{}, error) { return struct{}{}, f(d, r) }
}

func netAttrs(nid string) []any     { return []any{"network", nid} }
func epAttrs(nid, eid string) []any { return []any{"network", nid, "endpoint", eid} }
