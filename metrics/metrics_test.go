package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
)

func scrape(t *testing.T, src Sources, calls *Calls) string {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler(src, calls).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestScrape(t *testing.T) {
	src := Sources{
		Networks: func() []driver.NetworkStats {
			return []driver.NetworkStats{{
				ID: "net1", VNI: 256, Sandbox: true, Joined: 1, Unjoined: 1, Remote: 2, FDBEntries: 2,
				Services: []driver.ServiceState{{Name: "web", VIP: netip.MustParseAddr("10.0.0.2"), Tasks: 3,
					Backends: []driver.BackendState{{Addr: netip.MustParseAddr("10.0.0.3"), Connections: 5}, {Addr: netip.MustParseAddr("10.0.0.4")}}}},
			}, {ID: "enc1", FDBEntries: -1, Refused: &driver.Refusal{Reason: "no secret", Count: 3}}}
		},
		Cluster: func() (cluster.Stats, bool) {
			return cluster.Stats{MembersAlive: 3, Records: 7, BytesSent: 1000, RejectedVTEP: 2, RejectedCompressed: 5, MetaPushPulls: 4,
				RejectedWireVersion: 6, MembersRestarting: 1, RestartsAnnounced: 2, RestartsReceived: 8}, true
		},
		Encryption: func() (encryption.Status, bool) {
			return encryption.Status{Own: make([]encryption.PublicKeyInfo, 2), Remotes: []encryption.RemoteStatus{
				{PolicySPI: 7}, {Blocked: true},
			}, States: make([]encryption.StateInfo, 4), LastError: "boom",
				Firewall: encryption.FirewallCounters{Marked: 9, PlaintextDropped: 5, UnprotectedDropped: 3}, Unshared: 2}, true
		},
		Secrets: func() (encryption.SecretsStatus, bool) {
			return encryption.SecretsStatus{Held: []string{"0000000b", "0000000a"}, FileError: "line 2", Members: []encryption.MemberSecrets{
				{Name: "n2", Secrets: []string{"0000000a", "0000000b"}, PairSecret: "0000000b"},
				{Name: "n3", Secrets: []string{"0000000a"}, LacksPrimary: true},
			}}, true
		},
	}
	calls := NewCalls()
	calls.Observe("Join", 2*time.Millisecond, nil)
	calls.Observe("Join", time.Millisecond, errors.New("no"))
	out := scrape(t, src, calls)
	for _, want := range []string{
		`overlay_plugin_network_endpoints{joined="true",network="net1",vni="256"} 1`,
		`overlay_plugin_network_refusals_total{network="enc1"} 3`,
		`overlay_plugin_network_endpoints{joined="false",network="net1",vni="256"} 1`,
		`overlay_plugin_network_remote_endpoints{network="net1",vni="256"} 2`,
		`overlay_plugin_network_fdb_entries{network="net1",vni="256"} 2`,
		`overlay_plugin_network_sandbox{network="net1",vni="256"} 1`,
		`overlay_plugin_service_tasks{network="net1",service="web",vip="10.0.0.2"} 3`,
		`overlay_plugin_service_backends{network="net1",service="web",vip="10.0.0.2"} 2`,
		`overlay_plugin_service_connections_total{backend="10.0.0.3",network="net1",service="web",vip="10.0.0.2"} 5`,
		`overlay_plugin_service_connections_total{backend="10.0.0.4",network="net1",service="web",vip="10.0.0.2"} 0`,
		`overlay_plugin_gossip_members_alive 3`,
		`overlay_plugin_gossip_records 7`,
		`overlay_plugin_gossip_bytes_total{direction="sent"} 1000`,
		`overlay_plugin_gossip_rejected_total{reason="vtep_mismatch"} 2`,
		`overlay_plugin_gossip_rejected_total{reason="compressed"} 5`,
		`overlay_plugin_gossip_rejected_total{reason="decrypt"} 0`,
		`overlay_plugin_gossip_meta_push_pulls_total 4`,
		`overlay_plugin_gossip_rejected_total{reason="wire_version"} 6`,
		`overlay_plugin_gossip_members_restarting 1`,
		`overlay_plugin_gossip_restarts_announced_total 2`,
		`overlay_plugin_gossip_restarts_received_total 8`,
		`overlay_plugin_encryption_supported 1`,
		`overlay_plugin_encryption_own_generations 2`,
		`overlay_plugin_encryption_remotes{policy="active"} 1`,
		`overlay_plugin_encryption_remotes{policy="blocked"} 1`,
		`overlay_plugin_encryption_sas 4`,
		`overlay_plugin_encryption_last_error 1`,
		`overlay_plugin_encryption_firewall_packets_total{rule="marked"} 9`,
		`overlay_plugin_encryption_firewall_packets_total{rule="plaintext_dropped"} 5`,
		`overlay_plugin_encryption_firewall_packets_total{rule="unprotected_dropped"} 3`,
		`overlay_plugin_encryption_unshared_secret_refusals_total 2`,
		`overlay_plugin_secret_held{id="0000000b",primary="true"} 1`,
		`overlay_plugin_secret_held{id="0000000a",primary="false"} 1`,
		`overlay_plugin_secret_file_error 1`,
		`overlay_plugin_member_secret{id="0000000b",member="n2"} 1`,
		`overlay_plugin_member_lacks_primary{member="n2"} 0`,
		`overlay_plugin_member_lacks_primary{member="n3"} 1`,
		`overlay_plugin_ipsec_pair_secret{id="0000000b",member="n2"} 1`,
		`overlay_plugin_driver_calls_total{call="Join",outcome="ok"} 1`,
		`overlay_plugin_driver_calls_total{call="Join",outcome="error"} 1`,
		`overlay_plugin_driver_call_duration_seconds_count{call="Join"} 2`,
		`go_goroutines `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if strings.Contains(out, `network="enc1",vni=`) {
		t.Error("a network refused at creation has per-network gauges")
	}
	problems, err := testutil.CollectAndLint(collector{src})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestScrapeWithoutParts: before the driver is ready and without gossip or
// encryption, a scrape still answers, with what exists.
func TestScrapeWithoutParts(t *testing.T) {
	out := scrape(t, Sources{
		Cluster:    func() (cluster.Stats, bool) { return cluster.Stats{}, false },
		Encryption: func() (encryption.Status, bool) { return encryption.Status{}, false },
	}, NewCalls())
	if strings.Contains(out, "overlay_plugin_gossip_") || strings.Contains(out, "overlay_plugin_encryption_") {
		t.Errorf("metrics of parts that are not running:\n%s", out)
	}
	if !strings.Contains(out, "go_goroutines") {
		t.Error("no runtime metrics")
	}
}
