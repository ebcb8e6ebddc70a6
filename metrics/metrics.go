// Package metrics exports the plugin's state as Prometheus metrics. Gauges
// and counters are read at scrape time from the parts that own them (the
// driver's networks, the gossip cluster's Stats, the encryption manager's
// Status), so there is no second set of counters to keep in step; only the
// driver API calls are observed as they happen.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/health"
	"github.com/overlay-plugin/overlay-plugin/vxlanfilter"
)

const ns = "overlay_plugin"

// Sources are read at every scrape. Each may be nil, and Cluster and
// Encryption report false while their part is not running.
type Sources struct {
	Networks func() []driver.NetworkStats
	// Repairs are the reconcilers' repairs by kind (driver.Repairs).
	Repairs func() map[string]uint64
	// MACConflicts are the remote endpoints refused for a local
	// endpoint's MAC (driver.MACConflicts).
	MACConflicts func() uint64
	Cluster      func() (cluster.Stats, bool)
	Encryption   func() (encryption.Status, bool)
	// Secrets is the cluster's keyring as this node sees it.
	Secrets func() (encryption.SecretsStatus, bool)
	// Paths are the data-path probes' view of each peer (health).
	Paths func() []health.PathStatus
	// VXLANFilter is the VXLAN source filter's state; false: no filter.
	VXLANFilter func() (vxlanfilter.Status, bool)
	// Version and Commit label the build_info gauge, so that a roll
	// shows which nodes run which release.
	Version, Commit string
}

// Calls observes the driver API calls Docker makes.
type Calls struct {
	total    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewCalls returns an unregistered call observer.
func NewCalls() *Calls {
	return &Calls{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "driver_calls_total",
			Help: "Driver API calls (Docker's and the admin API's), by call and outcome (ok or error).",
		}, []string{"call", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "driver_call_duration_seconds",
			Help:    "Duration of driver API calls, by call.",
			Buckets: []float64{.0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}, []string{"call"}),
	}
}

// Observe records one call.
func (c *Calls) Observe(call string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	c.total.WithLabelValues(call, outcome).Inc()
	c.duration.WithLabelValues(call).Observe(d.Seconds())
}

// Handler serves the metrics of src and calls, with the Go runtime's and
// the process's.
func Handler(src Sources, calls *Calls) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collector{src}, calls.total, calls.duration)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(ns+"_"+name, help, labels, nil)
}

var (
	buildInfo    = desc("build_info", "1, labelled with the release and commit this plugin was built from.", "version", "commit")
	netEndpoints = desc("network_endpoints", "Local endpoints of a network, by joined (true, false).", "network", "vni", "joined")
	netPeers     = desc("network_remote_endpoints", "Remote endpoints in a network's peer table.", "network", "vni")
	netFDB       = desc("network_fdb_entries", "Static FDB entries in a network's sandbox, read from the kernel (one per remote endpoint when in sync).", "network", "vni")
	netSandbox   = desc("network_sandbox", "1 when the network has a sandbox on this host (a local endpoint joined).", "network", "vni")
	svcTasks     = desc("service_tasks", "Tasks Docker lists for a service with a VIP on a network.", "network", "service", "vip")
	svcBackends  = desc("service_backends", "Backends a service's VIP balances over here: its tasks whose endpoints the control plane knows.", "network", "service", "vip")
	netRefused   = desc("network_refusals_total", "Docker's calls about a network that this host refused to serve (an encrypted network without a secret or ESP; `overlay-plugin state` says why).", "network")
	repairs      = desc("reconcile_repairs_total", "Repairs the reconcilers made to the sandboxes, by kind: neighbor_added, neighbor_replaced, neighbor_removed, fdb_added, fdb_replaced, fdb_removed (entries that were missing, wrong, or wanted by no endpoint), device_rebuilt (a missing or wrong bridge or VXLAN device made anew), device_fixed (a device set up or put back on the bridge).", "kind")
	peersRefused = desc("peers_refused_total", "Remote endpoints the gossip delivered that this host refused, by reason: mac_conflict (a local endpoint of the network holds its MAC; it is added once the local endpoint goes).", "reason")
	svcConns     = desc("service_connections_total", "Connections this host's containers opened to a service's VIP, by the backend chosen (nft counters).", "network", "service", "vip", "backend")

	clGauges = map[string]*prometheus.Desc{
		"alive":      desc("gossip_members_alive", "Gossip members alive, this node included."),
		"gone":       desc("gossip_members_gone", "Gossip members gone whose records are still kept (within the dead grace, or the restart grace), restarting ones included."),
		"restarting": desc("gossip_members_restarting", "Gossip members gone after announcing a restart: their records are kept for the restart grace."),
		"records":    desc("gossip_records", "Live endpoint records, own and remote, of the networks this node has."),
		"networks":   desc("gossip_networks", "Networks this node has, whose records it receives."),
		"members":    desc("gossip_memberships", "Nodes' live memberships of networks, cluster-wide."),
		"own":        desc("gossip_own_records", "Live endpoint records published by this node."),
		"tombs":      desc("gossip_tombstones", "Tombstones of deleted endpoints kept."),
		"pending":    desc("gossip_pending_records", "Records held until their owner joins."),
		"broadcast":  desc("gossip_broadcasts_queued", "Membership broadcasts waiting to be sent."),
	}
	clBytes    = desc("gossip_bytes_total", "Payload bytes of the plugin's gossip (messages and push/pull state), by direction.", "direction")
	clMsgs     = desc("gossip_messages_received_total", "Gossip messages received.")
	clStates   = desc("gossip_push_pulls_total", "Push/pull state exchanges, by direction (sent, received).", "direction")
	clAccepted = desc("gossip_records_accepted_total", "Remote record updates applied, by source (push: from their owner or by gossip; anti_entropy; push_pull).", "source")
	clReceived = desc("gossip_records_received_total", "Remote records received, by path (push, gossip, anti_entropy, push_pull), each counted once whatever became of it.", "source")
	clStaleBy  = desc("gossip_records_stale_total", "Remote records received that were no newer than what was held (duplicates), by path as gossip_records_received_total.", "source")
	clPushes   = desc("gossip_pushes_total", "Messages sent straight to a member (pushes and anti-entropy), by result (sent, failed, dropped: the member was gone).", "result")
	clStreams  = desc("gossip_streams_total", "TCP streams this node opened to members (pushes, anti-entropy, push/pull, fallback pings), by how: session (over the one multiplexed connection kept per member), connection (a connection of its own: joins, members of release 0.1.0).", "via")
	clSessions = desc("gossip_sessions_dialed_total", "Multiplexed connections dialed to members; each carries memberlist's streams to that member until it leaves, restarts or is idle 2 minutes.")
	clChannels = desc("gossip_channels_dialed_total", "Channel connections dialed to members; each carries the pushes and anti-entropy between this node and that member, both ways, until it fails, leaves or restarts.")
	clSyncs    = desc("gossip_anti_entropy_total", "Anti-entropy digest exchanges, by direction (started, received).", "direction")
	clRejected = desc("gossip_rejected_total", "Gossip input refused, by reason: decrypt, plain (plaintext in an encrypted cluster), compressed, unknown_type, malformed, misdirected (a ping for another node), queue_full (memberlist's handler queue), stale (no newer than what is held; duplicates are routine), ownership (an endpoint another node owns), vtep_mismatch, owner_gone, wire_version (a message or a node of a wire version this node does not speak), stream_idle (a gossip connection that sent no whole first message in time), stream_limit (a gossip connection over the bound of those not yet checked).", "reason")
	clOther    = map[string]*prometheus.Desc{
		"retracted":    desc("gossip_records_retracted_total", "Own records of an earlier incarnation tombstoned."),
		"purged":       desc("gossip_records_purged_total", "Records of nodes gone past the dead grace removed."),
		"expired":      desc("gossip_tombstones_expired_total", "Tombstones expired."),
		"dropped":      desc("gossip_pending_dropped_total", "Pending records dropped (expired or over the limit)."),
		"epochs":       desc("gossip_epoch_bumps_total", "Times this node's epoch moved past one seen from the network."),
		"delivered":    desc("gossip_deliveries_total", "Remote endpoint changes handed to the driver."),
		"sinkErr":      desc("gossip_delivery_errors_total", "Remote endpoint changes the driver did not apply."),
		"metaPush":     desc("gossip_meta_push_pulls_total", "Push/pull rounds that carried a change of this node's meta (its keys)."),
		"ignored":      desc("gossip_records_ignored_total", "Endpoint records received for networks this node does not have."),
		"restartsSent": desc("gossip_restarts_announced_total", "Restart announcements this node delivered to members as it was stopped on purpose."),
		"restartsIn":   desc("gossip_restarts_received_total", "Restart announcements received from other members."),
	}

	pathUp     = desc("datapath_up", "1 when probes of the network's MTU to a peer are answered, 0 when they are not (down: nothing crosses; mtu: small probes cross), by peer, path (vxlan, esp) and state. Unprobed peers (an older release) and ones not probed long enough are left out.", "peer", "path", "state")
	pathRTT    = desc("datapath_rtt_seconds", "Round-trip time of the last answered probe to a peer, by path.", "peer", "path")
	pathMTU    = desc("datapath_mtu_bytes", "Largest packet seen crossing to a peer (the network's MTU while up; what the search found on an MTU problem), by path.", "peer", "path")
	pathProbes = desc("datapath_probes_total", "Data-path probes to a peer, by path and result (sent, answered).", "peer", "path", "result")

	encUp          = desc("encryption_supported", "1 when this host can serve encrypted networks (secret set, kernel has ESP with AES-GCM).")
	encGens        = desc("encryption_own_generations", "This node's key generations published (current, next, retiring).")
	encVNIs        = desc("encryption_vnis", "Encrypted VNIs with a local sandbox.")
	encRemotes     = desc("encryption_remotes", "Remote hosts programmed for IPsec, by policy state (active, blocked: waiting for keys).", "policy")
	encSAs         = desc("encryption_sas", "IPsec SAs of this plugin in the kernel.")
	encLastErrored = desc("encryption_last_error", "1 when the last IPsec programming failed (see `overlay-plugin encryption`).")
	fwPackets      = desc("firewall_packets_total", "VXLAN packets of the plugin's networks the source filter dropped since its table was last built, by reason: unknown_source (not a member's VTEP nor a remote endpoint's).", "reason")
	fwSources      = desc("vxlan_filter_sources", "Sources (VTEPs) the VXLAN source filter admits.")
	fwIntact       = desc("vxlan_filter_intact", "1 when the kernel's source filter table is what the plugin programmed; 0 until the repair rebuilds one changed from outside.")
	secHeld        = desc("secret_held", "1 for each cluster secret this node holds, by id (never the secret) and whether it is the primary (sent with).", "id", "primary")
	secFileError   = desc("secret_file_error", "1 when the secret file's last reading was refused: the secrets held stay in use (see the log or `overlay-plugin cluster`).")
	secMember      = desc("member_secret", "1 for each cluster secret a live member said it holds, by member and id.", "member", "id")
	secLacks       = desc("member_lacks_primary", "1 for a live member that holds none of this node's primary secret: removing the others would cut it off.", "member")
	secPair        = desc("ipsec_pair_secret", "1 for the cluster secret this node's IPsec traffic to a member is keyed with, by member and id.", "member", "id")
	secUnshared    = desc("encryption_unshared_secret_refusals_total", "Times a remote host in use was found to hold none of this node's cluster secrets: its encrypted traffic is blocked.")
	encFirewall    = desc("encryption_firewall_packets_total", "Packets of encrypted VNIs seen by the firewall rules since they were last built, by rule: marked (went out for IPsec), plaintext_dropped (came in without IPsec), unprotected_dropped (no IPsec policy took them on the way out).", "rule")
)

type collector struct{ src Sources }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(buildInfo, prometheus.GaugeValue, 1, c.src.Version, c.src.Commit)
	if c.src.Networks != nil {
		collectNetworks(ch, c.src.Networks())
	}
	if c.src.Repairs != nil {
		for kind, v := range c.src.Repairs() {
			counter(ch, repairs, v, kind)
		}
	}
	if c.src.MACConflicts != nil {
		counter(ch, peersRefused, c.src.MACConflicts(), "mac_conflict")
	}
	if c.src.Cluster != nil {
		if s, ok := c.src.Cluster(); ok {
			collectCluster(ch, s)
		}
	}
	if c.src.Encryption != nil {
		if s, ok := c.src.Encryption(); ok {
			collectEncryption(ch, s)
		}
	}
	if c.src.Secrets != nil {
		if s, ok := c.src.Secrets(); ok {
			collectSecrets(ch, s)
		}
	}
	if c.src.Paths != nil {
		collectPaths(ch, c.src.Paths())
	}
	if c.src.VXLANFilter != nil {
		if s, ok := c.src.VXLANFilter(); ok {
			counter(ch, fwPackets, s.Dropped, "unknown_source")
			gauge(ch, fwSources, float64(len(s.Sources)))
			gauge(ch, fwIntact, bool01(s.Intact))
		}
	}
}

func collectPaths(ch chan<- prometheus.Metric, paths []health.PathStatus) {
	for _, p := range paths {
		peer, path := p.Peer.String(), string(p.Path)
		if p.State == health.StateUnprobed || p.State == health.StateUnknown {
			continue
		}
		gauge(ch, pathUp, bool01(p.State == health.StateUp), peer, path, string(p.State))
		if p.RTT > 0 {
			gauge(ch, pathRTT, p.RTT.Seconds(), peer, path)
		}
		if p.PathMTU > 0 {
			gauge(ch, pathMTU, float64(p.PathMTU), peer, path)
		}
		counter(ch, pathProbes, p.Sent, peer, path, "sent")
		counter(ch, pathProbes, p.Answered, peer, path, "answered")
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func collectNetworks(ch chan<- prometheus.Metric, nets []driver.NetworkStats) {
	for _, n := range nets {
		if n.Refused != nil {
			counter(ch, netRefused, uint64(n.Refused.Count), n.ID)
			if n.VNI == 0 {
				continue // refused at creation: nothing else to say
			}
		}
		vni := strconv.FormatUint(uint64(n.VNI), 10)
		gauge(ch, netEndpoints, float64(n.Joined), n.ID, vni, "true")
		gauge(ch, netEndpoints, float64(n.Unjoined), n.ID, vni, "false")
		gauge(ch, netPeers, float64(n.Remote), n.ID, vni)
		gauge(ch, netSandbox, bool01(n.Sandbox), n.ID, vni)
		if n.FDBEntries >= 0 {
			gauge(ch, netFDB, float64(n.FDBEntries), n.ID, vni)
		}
		for _, s := range n.Services {
			vip := s.VIP.String()
			gauge(ch, svcTasks, float64(s.Tasks), n.ID, s.Name, vip)
			gauge(ch, svcBackends, float64(len(s.Backends)), n.ID, s.Name, vip)
			for _, b := range s.Backends {
				counter(ch, svcConns, b.Connections, n.ID, s.Name, vip, b.Addr.String())
			}
		}
	}
}

func collectCluster(ch chan<- prometheus.Metric, s cluster.Stats) {
	for k, v := range map[string]int{"alive": s.MembersAlive, "gone": s.MembersGone, "restarting": s.MembersRestarting, "records": s.Records, "own": s.OwnRecords,
		"tombs": s.Tombstones, "pending": s.Pending, "broadcast": s.BroadcastsQueued, "networks": s.Networks, "members": s.Memberships} {
		gauge(ch, clGauges[k], float64(v))
	}
	counter(ch, clBytes, s.BytesSent, "sent")
	counter(ch, clBytes, s.BytesReceived, "received")
	counter(ch, clMsgs, s.MessagesReceived)
	counter(ch, clStates, s.StatesSent, "sent")
	counter(ch, clStates, s.StatesReceived, "received")
	counter(ch, clAccepted, s.Accepted, "push")
	counter(ch, clAccepted, s.AcceptedFromSync, "anti_entropy")
	counter(ch, clAccepted, s.AcceptedFromState, "push_pull")
	for _, p := range []struct {
		d *prometheus.Desc
		v cluster.Paths
	}{{clReceived, s.Received}, {clStaleBy, s.StaleFrom}} {
		counter(ch, p.d, p.v.Push, "push")
		counter(ch, p.d, p.v.Gossip, "gossip")
		counter(ch, p.d, p.v.AntiEntropy, "anti_entropy")
		counter(ch, p.d, p.v.PushPull, "push_pull")
	}
	counter(ch, clPushes, s.PushesSent, "sent")
	counter(ch, clPushes, s.PushErrors, "failed")
	counter(ch, clPushes, s.PushesDropped, "dropped")
	counter(ch, clStreams, s.StreamsOverSessions, "session")
	counter(ch, clStreams, s.StreamsOwnConnection, "connection")
	counter(ch, clSessions, s.SessionsDialed)
	counter(ch, clChannels, s.ChannelsDialed)
	counter(ch, clSyncs, s.SyncsSent, "started")
	counter(ch, clSyncs, s.SyncsReceived, "received")
	for reason, v := range s.Rejections() {
		counter(ch, clRejected, v, reason)
	}
	for k, v := range map[string]uint64{"retracted": s.Retracted, "purged": s.Purged, "expired": s.ExpiredTombstones,
		"dropped": s.PendingDropped, "epochs": s.EpochBumps, "delivered": s.Deliveries, "sinkErr": s.SinkErrors,
		"metaPush": s.MetaPushPulls, "ignored": s.Ignored, "restartsSent": s.RestartsAnnounced, "restartsIn": s.RestartsReceived} {
		counter(ch, clOther[k], v)
	}
}

func collectEncryption(ch chan<- prometheus.Metric, s encryption.Status) {
	gauge(ch, encUp, bool01(s.Supported == ""))
	gauge(ch, encGens, float64(len(s.Own)))
	gauge(ch, encVNIs, float64(len(s.VNIs)))
	active, blocked := 0, 0
	for _, r := range s.Remotes {
		switch {
		case r.Blocked:
			blocked++
		case r.PolicySPI != 0:
			active++
		}
	}
	gauge(ch, encRemotes, float64(active), "active")
	gauge(ch, encRemotes, float64(blocked), "blocked")
	gauge(ch, encSAs, float64(len(s.States)))
	gauge(ch, encLastErrored, bool01(s.LastError != ""))
	counter(ch, encFirewall, s.Firewall.Marked, "marked")
	counter(ch, encFirewall, s.Firewall.PlaintextDropped, "plaintext_dropped")
	counter(ch, encFirewall, s.Firewall.UnprotectedDropped, "unprotected_dropped")
	counter(ch, secUnshared, s.Unshared)
}

func collectSecrets(ch chan<- prometheus.Metric, s encryption.SecretsStatus) {
	for i, id := range s.Held {
		gauge(ch, secHeld, 1, id, strconv.FormatBool(i == 0))
	}
	gauge(ch, secFileError, bool01(s.FileError != ""))
	for _, m := range s.Members {
		for _, id := range m.Secrets {
			gauge(ch, secMember, 1, m.Name, id)
		}
		gauge(ch, secLacks, bool01(m.LacksPrimary), m.Name)
		if m.PairSecret != "" {
			gauge(ch, secPair, 1, m.Name, m.PairSecret)
		}
	}
}
