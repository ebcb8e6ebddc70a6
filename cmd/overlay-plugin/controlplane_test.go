package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/cluster/memnet"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/fakexfrm"
	"github.com/overlay-plugin/overlay-plugin/firewall/firewalltest"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
	"github.com/overlay-plugin/overlay-plugin/pluginapi/pluginapitest"

	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// node is one in-process plugin with gossip on an in-memory network.
type node struct {
	*instance
	addr netip.Addr
	x    *fakexfrm.XFRM
	fw   *firewalltest.Fake
}

func startNode(t *testing.T, net *memnet.Network, i int, secretFile string, join ...string) *node {
	t.Helper()
	addr := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
	cfg := testConfig(t)
	cfg.AdvertiseAddr, cfg.GossipPort, cfg.Join, cfg.NodeName = addr, defaultGossipPort, join, addr.String()
	cfg.SecretFile, cfg.DeadGrace, cfg.KeyRotation = secretFile, time.Minute, time.Hour
	return runNode(t, net, &node{addr: addr, x: fakexfrm.New(), fw: firewalltest.New()}, cfg, fakekernel.New())
}

// startPair starts two plugins with one cluster secret, b joining a.
func startPair(t *testing.T, net *memnet.Network) (a, b *node) {
	t.Helper()
	secretFile := filepath.Join(t.TempDir(), "secret")
	key := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	if err := os.WriteFile(secretFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startNode(t, net, 1, secretFile), startNode(t, net, 2, secretFile, "198.51.100.1")
}

// runNode starts n's plugin on cfg and the given kernel, xfrm and firewall:
// new ones, or those a stopped run left.
func runNode(t *testing.T, net *memnet.Network, n *node, cfg serveConfig, k *fakekernel.Kernel) *node {
	t.Helper()
	tr, err := net.NewTransport(netip.AddrPortFrom(n.addr, defaultGossipPort))
	if err != nil {
		t.Fatal(err)
	}
	deps := testDeps(k)
	deps.gossipTransport = tr
	deps.newEncryption = func(serveConfig, uint16) (encryption.XFRM, encryption.Firewall, func(), error) {
		return n.x, n.fw, func() {}, nil
	}
	in := start(t, cfg, deps)
	in.kernel = k
	in.waitHealthy(t)
	return &node{instance: in, addr: n.addr, x: n.x, fw: n.fw}
}

// How long the in-process plugins may take to agree, polled every tick.
const (
	settle = 20 * time.Second
	tick   = 20 * time.Millisecond
)

// TestGossipWiresDriversTogether runs two plugins in-process, joined by
// gossip on an in-memory network with a cluster secret, and checks that an
// endpoint joined on one is programmed on the other, that encryption keys
// are exchanged so each side's outbound SA exists at the other, and that a
// leave is retracted.
func TestGossipWiresDriversTogether(t *testing.T) {
	net := memnet.New()
	a, b := startPair(t, net)

	admin := adminapi.NewClient(b.cfg.AdminSocket)
	defer admin.Close()
	wait.For(t, settle, tick, "gossip membership", wait.Bool(func() bool {
		raw, err := admin.Cluster()
		return err == nil && len(raw) > 0 && countAlive(raw) == 2
	}))

	// The same network on both, as Docker creates it after AllocateNetwork.
	ca, cb := unixClient(a.cfg.Socket), unixClient(b.cfg.Socket)
	opts := map[string]string{"vxlanid_list": "300", "encrypted": ""}
	pluginapitest.Post(t, ca, "http://a", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net1", opts, "203.0.113.0/24")).OK(t, "create on a", nil)
	pluginapitest.Post(t, cb, "http://b", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net1", opts, "203.0.113.0/24")).OK(t, "create on b", nil)
	pluginapitest.Post(t, ca, "http://a", "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "net1", "EndpointID": "epa",
		"Interface": map[string]any{"Address": "203.0.113.1/24"}}).OK(t, "endpoint on a", nil)
	pluginapitest.Post(t, cb, "http://b", "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "net1", "EndpointID": "epb",
		"Interface": map[string]any{"Address": "203.0.113.2/24"}}).OK(t, "endpoint on b", nil)
	pluginapitest.Post(t, ca, "http://a", "/NetworkDriver.Join", map[string]any{"NetworkID": "net1", "EndpointID": "epa", "SandboxKey": "/x"}).OK(t, "join on a", nil)
	pluginapitest.Post(t, cb, "http://b", "/NetworkDriver.Join", map[string]any{"NetworkID": "net1", "EndpointID": "epb", "SandboxKey": "/y"}).OK(t, "join on b", nil)

	ipA, ipB := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	wait.For(t, settle, tick, "each endpoint programmed on the other host", wait.Bool(func() bool {
		sa, sb := a.kernel.Snapshot()["net1"], b.kernel.Snapshot()["net1"]
		if sa == nil || sb == nil {
			return false
		}
		_, okA := sa.Neighbors[ipB]
		_, okB := sb.Neighbors[ipA]
		return okA && okB
	}))
	wait.For(t, settle, tick, "keys exchanged: each outbound SA exists at the receiver", wait.Bool(func() bool {
		return pathReady(a, b) && pathReady(b, a)
	}))

	pluginapitest.Post(t, cb, "http://b", "/NetworkDriver.Leave", map[string]any{"NetworkID": "net1", "EndpointID": "epb"}).OK(t, "leave on b", nil)
	wait.For(t, settle, tick, "leave retracted on a", wait.Bool(func() bool {
		_, ok := a.kernel.Snapshot()["net1"].Neighbors[ipB]
		return !ok
	}))
	wait.For(t, settle, tick, "IPsec state towards b released on a", wait.Bool(func() bool {
		pols, _ := a.x.Policies()
		return len(pols) == 0
	}))
}

// TestRestartKeepsEncryptedNetwork stops and starts a's plugin, as
// `docker plugin disable`/`enable` does, while its container is joined to
// an encrypted network: the sandbox, the SAs, the policy and the firewall
// rules stay through the stop, the new run takes them over, and each
// direction keeps an SA both ends agree on throughout.
func TestRestartKeepsEncryptedNetwork(t *testing.T) {
	net := memnet.New()
	a, b := startPair(t, net)
	opts := map[string]string{"vxlanid_list": "300", "encrypted": ""}
	for i, n := range []*node{a, b} {
		c := unixClient(n.cfg.Socket)
		ep := fmt.Sprintf("ep%d", i)
		pluginapitest.Post(t, c, "http://p", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net1", opts, "203.0.113.0/24")).OK(t, "create", nil)
		pluginapitest.Post(t, c, "http://p", "/NetworkDriver.CreateEndpoint", map[string]any{"NetworkID": "net1", "EndpointID": ep,
			"Interface": map[string]any{"Address": fmt.Sprintf("203.0.113.%d/24", i+1)}}).OK(t, "endpoint", nil)
		pluginapitest.Post(t, c, "http://p", "/NetworkDriver.Join", map[string]any{"NetworkID": "net1", "EndpointID": ep, "SandboxKey": "/x"}).OK(t, "join", nil)
	}
	wait.For(t, settle, tick, "keys exchanged: each outbound SA exists at the receiver", wait.Bool(func() bool {
		return pathReady(a, b) && pathReady(b, a)
	}))
	before, _ := a.x.States()

	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	after, _ := a.x.States()
	if a.kernel.Snapshot()["net1"] == nil || len(after) != len(before) || !a.fw.Enabled(300) || !pathReady(a, b) || !pathReady(b, a) {
		t.Fatalf("the stop removed state: sandbox %v, SAs %d of %d, firewall %v", a.kernel.Snapshot()["net1"] != nil, len(after), len(before), a.fw.VNIs())
	}
	cfg := a.cfg
	cfg.Join = []string{"198.51.100.2"} // as Docker's node hints give it
	a = runNode(t, net, a, cfg, a.kernel)
	if !pathReady(a, b) || !pathReady(b, a) {
		t.Fatal("a path lost as the new run started")
	}
	admin := adminapi.NewClient(a.cfg.AdminSocket)
	defer admin.Close()
	nets, err := admin.Networks()
	if err != nil || len(nets) != 1 || nets[0].Sandbox != "net1" || !nets[0].Endpoints[0].Joined {
		t.Fatalf("the new run lists %+v, %v: want the sandbox adopted, its endpoint joined", nets, err)
	}
	wait.For(t, settle, tick, "a's sandbox guarded again and b's endpoint back", wait.Bool(func() bool {
		_, ok := a.kernel.Snapshot()["net1"].Neighbors[netip.MustParseAddr("203.0.113.2")]
		return ok && a.fw.Enabled(300)
	}))
	wait.For(t, settle, tick, "b installs inbound SAs for a's new generation", wait.Bool(func() bool {
		states, _ := b.x.States()
		return len(states) > len(before)
	}))
	if !pathReady(a, b) || !pathReady(b, a) {
		t.Fatal("a path lost after the new run took over")
	}
}

func countAlive(raw []byte) int {
	var v struct {
		Members []struct {
			State string `json:"state"`
		} `json:"members"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0
	}
	n := 0
	for _, m := range v.Members {
		if m.State == "alive" {
			n++
		}
	}
	return n
}

// pathReady: from's policy to to names an SA that to holds with the same
// key.
func pathReady(from, to *node) bool {
	pols, _ := from.x.Policies()
	for _, p := range pols {
		if p.Dst != to.addr || p.SPI == 0 {
			continue
		}
		out, ok1 := from.x.Key(to.addr, p.SPI)
		in, ok2 := to.x.Key(to.addr, p.SPI)
		return ok1 && ok2 && string(in) == string(out)
	}
	return false
}

// TestPeerByHandRefusedUnderGossip: gossip owns a host's remote peers and
// its next sync would undo a hand's change, so `peer add` and `peer del`
// are refused (409, saying how to manage peers by hand) and the network
// keeps what it had.
func TestPeerByHandRefusedUnderGossip(t *testing.T) {
	net := memnet.New()
	a, _ := startPair(t, net)
	ca := unixClient(a.cfg.Socket)
	pluginapitest.Post(t, ca, "http://a", "/NetworkDriver.CreateNetwork", pluginapitest.CreateNetwork("net1", map[string]string{"vxlanid_list": "300"}, "203.0.113.0/24")).OK(t, "create on a", nil)

	admin := adminapi.NewClient(a.cfg.AdminSocket)
	defer admin.Close()
	before, err := admin.Networks()
	if err != nil {
		t.Fatal(err)
	}
	peer := peerdb.Peer{EndpointID: "byhand", IPs: []netip.Addr{netip.MustParseAddr("203.0.113.9")},
		MAC: hwaddr.MAC{0x02, 0x42, 0, 0, 0, 9}, VTEP: netip.MustParseAddr("198.51.100.2")}
	for name, err := range map[string]error{"peer add": admin.AddPeer("net1", peer), "peer del": admin.DeletePeer("net1", "byhand")} {
		if !errors.Is(err, driver.ErrConflict) || !strings.Contains(err.Error(), "--gossip-port 0") {
			t.Errorf("%s under gossip: %v, want a conflict that names --gossip-port 0", name, err)
		}
	}
	after, err := admin.Networks()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused peer add changed the networks: %v, was %v", after, before)
	}
}
