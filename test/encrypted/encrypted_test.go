// Package encrypted runs the plugin binary on three simulated hosts
// (network namespaces on a switch bridge) with the gossip control plane and
// one shared cluster secret, creates an encrypted network (--opt
// encrypted) and an unencrypted one the way a swarm does, and checks the
// IPsec data path end to end:
//
//  1. containers reach each other across hosts (ICMP, TCP; IPv4 and IPv6);
//  2. ESP is really used: the SA counters (admin API and `ip -s xfrm
//     state`) grow with traffic, a capture on the underlay sees ESP and no
//     plaintext VXLAN of the encrypted VNI, the container MTU is the
//     underlay's minus VXLAN minus ESP overhead (1413 on IPv4), and a
//     DF-set ping of exactly that size passes unfragmented;
//  3. plaintext VXLAN for the encrypted VNI, sent raw onto the underlay,
//     never reaches the container (the nftables guard drops it), while the
//     same packet reaches a container of the unencrypted network, and the
//     same packet sent through IPsec reaches the encrypted one; and with
//     the xfrm state and policies flushed from outside, outbound VXLAN of
//     the encrypted VNI is dropped, never sent in clear, until the plugin
//     has programmed them again (within seconds);
//  4. a forced key rotation on every host under continuous sequenced UDP
//     traffic loses nothing: every sequence number arrives exactly once;
//  5. the retired generations are gone everywhere: from the key lists,
//     and no SA or policy uses them (every SPI changed); h1's only
//     container leaves and joins again while h2 cannot hear of it, and
//     still reaches h2 (the outbound SA is reused, numbering on); then
//     h1's plugin is stopped and started again, as `docker plugin
//     disable`/`enable` does, under the same streams and cut off from
//     gossip for longer than Lead: the new run takes the IPsec state over,
//     nothing is lost or sent in clear, and the previous run's SAs are
//     gone once its generation retires;
//  6. Leave, DeleteEndpoint and DeleteNetwork leave no xfrm state, no xfrm
//     policy of ours and no nftables table on any host.
//
// That the retired private key's bytes are wiped from memory is checked in
// process by encryption.TestRetiredKeyLeavesNoCopyInMemory.
//
// Needs root, iproute2 with xfrm, nft, and a kernel with veth, bridge,
// vxlan, nf_tables and IPsec ESP with rfc4106(gcm(aes)); skips, saying why,
// otherwise. Development machines' kernels often lack ESP: `make test-vm`
// runs this package in a VM on Debian's stock kernel (scripts/vm). The
// plugin binary is $OVERLAY_PLUGIN_BIN or is built from ./cmd/overlay-plugin.
// Bounds are sized for that VM (software emulation, 5-20x slower than
// native): the whole test takes one to three minutes there.
package encrypted

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"
	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/netlinkxfrm"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "encrypted") }

var espReq = testbed.NewRequirement("encrypted",
	func() error {
		if _, err := exec.LookPath("nft"); err != nil {
			return errors.New("needs nft (nftables) in PATH to read the hosts' firewall tables")
		}
		return nil
	},
	func() error {
		start := time.Now()
		if err := probeESP(); err != nil {
			return err
		}
		fmt.Printf("encrypted: kernel does ESP with %s (probe SA took %v)\n", encryption.AEADName, time.Since(start).Round(time.Millisecond))
		return nil
	})

// requireESP skips unless the machine can host the testbed and its kernel
// does ESP with AES-GCM.
func requireESP(t *testing.T) {
	t.Helper()
	espReq.Require(t)
}

// probeESP asks the plugin's own probe (adding and removing an ESP state
// with the plugin's AEAD) in a throwaway namespace.
func probeESP() (err error) {
	bed := testbed.New(nil)
	defer func() { err = errors.Join(err, bed.Cleanup()) }()
	ns, err := bed.NewNetns("espprobe")
	if err != nil {
		return err
	}
	err = ns.Do(func() error {
		x, err := netlinkxfrm.New(netns.None())
		if err != nil {
			return err
		}
		defer x.Close()
		return x.Check()
	})
	if err != nil {
		return fmt.Errorf("this kernel (%s) cannot run the encrypted data path (run it in the VM: make test-vm): %w", kernelRelease(), err)
	}
	return nil
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown kernel"
	}
	return "Linux " + strings.TrimSpace(string(b))
}

const (
	gossipPort  = 7947
	vxlanPort   = 4789
	keyRotation = 60 * time.Second
	// The schedule the plugin derives from --key-rotation 60s:
	// Lead = min(1m, interval/10), Grace = min(2m, interval/5).
	lead  = 6 * time.Second
	grace = 12 * time.Second

	underlayMTU   = 1500 // veth default
	vxlanOverhead = 20 + 8 + 8 + 14
	wantMTU       = underlayMTU - vxlanOverhead - encryption.Overhead // 1413
	plainMTU      = underlayMTU - vxlanOverhead                       // 1450

	// Bounds sized for the VM. The first SA of a boot loads esp4 and gcm
	// and runs the crypto self-tests (1.5-9 s there).
	pluginStart = 120 * time.Second
	converge    = 90 * time.Second
	firstPing   = 60 * time.Second
	tcpSize     = 128 << 10
	tcpTimeout  = 60 * time.Second
	poll        = 250 * time.Millisecond
	streamEvery = 50 * time.Millisecond

	echoPort   = 5201
	sinkPort   = 9999
	streamPort = 7001
)

// The overlays' address plans, as swarm's IPAM would hand them out.
var (
	encPool4   = netip.MustParsePrefix("203.0.113.0/25")
	encGW4     = "203.0.113.126/25"
	encPool6   = netip.MustParsePrefix("2001:db8:e0::/64")
	encGW6     = "2001:db8:e0::fffe/64"
	plainPool4 = netip.MustParsePrefix("203.0.113.128/25")
	plainGW4   = "203.0.113.254/25"
)

type node struct {
	name   string
	host   *testbed.Host
	plugin *testbed.Plugin
	cfg    testbed.PluginConfig // to start it again
}

type network struct {
	name      string
	id        string
	vni       uint32
	encrypted bool
	pool4     netip.Prefix
	gw4       string
	pool6     netip.Prefix // invalid: IPv4 only
	gw6       string
	options   map[string]string // what AllocateNetwork returned
}

type endpoint struct {
	name  string
	id    string
	node  *node
	net   *network
	mac   string
	addrs []netip.Prefix
	ctr   *testbed.Container
	join  *api.JoinResponse
}

func (e *endpoint) addr(f testbed.Family) netip.Addr {
	a, ok := e.ctr.Addr(f)
	if !ok {
		panic(fmt.Sprintf("%s has no %v address", e.name, f))
	}
	return a
}

// suite is the cluster under test, shared by the phases.
type suite struct {
	bed        *testbed.Bed
	topo       *testbed.Topology
	bin        string
	nodes      []*node
	enc, plain *network
	mu         sync.Mutex // guards eps and byName while setup attaches in parallel
	eps        []*endpoint
	byName     map[string]*endpoint

	// From the rotation phase, for the next one.
	preRotation  map[*node]encryption.Status
	postRotation map[*node]encryption.Status
	newGen       map[*node]uint64
}

// parallel runs fns concurrently and joins their errors.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// forNodes runs fn for every node concurrently.
func (s *suite) forNodes(fn func(n *node) error) error {
	fns := make([]func() error, len(s.nodes))
	for i, n := range s.nodes {
		fns[i] = func() error { return fn(n) }
	}
	return parallel(fns...)
}

// waitFor polls check every poll until it returns nil or timeout passes,
// and returns the last error then.
func waitFor(what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v: %w", what, timeout, err)
		}
		time.Sleep(poll)
	}
}

func (s *suite) status(n *node) (encryption.Status, error) {
	var st encryption.Status
	err := n.plugin.AdminJSON("/v1/encryption", &st)
	return st, err
}

func (s *suite) mustStatus(t *testing.T, n *node) encryption.Status {
	t.Helper()
	st, err := s.status(n)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func remoteOf(st encryption.Status, vtep netip.Addr) *encryption.RemoteStatus {
	for i := range st.Remotes {
		if st.Remotes[i].VTEP == vtep {
			return &st.Remotes[i]
		}
	}
	return nil
}

func (s *suite) others(n *node) []*node {
	var out []*node
	for _, o := range s.nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// cli runs an overlay-plugin client subcommand against n's admin socket.
func (s *suite) cli(n *node, args ...string) (string, error) {
	return testbed.Run(append(append([]string{s.bin}, args...), "--admin-socket", n.plugin.AdminSocket)...)
}

func dumpStatus(st encryption.Status) string {
	b, _ := json.Marshal(st)
	return string(b)
}

// ---------------------------------------------------------------------------

func TestEncryptedOverlay(t *testing.T) {
	requireESP(t)
	start := time.Now()
	s := setup(t)
	t.Logf("TIMING setup (3 plugins, 2 networks, 5 containers, SAs programmed): %v", time.Since(start).Round(time.Millisecond))
	phases := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"1-connectivity", s.phaseConnectivity},
		{"2-esp-in-use", s.phaseESP},
		{"3-plaintext-dropped", s.phasePlaintext},
		{"3b-outside-flush-fails-closed", s.phaseOutsideFlush},
		{"4-rotation-lossless", s.phaseRotation},
		{"5-retired-generation-gone", s.phaseRetired},
		{"5b-container-back-keeps-sequence", s.phaseContainerBack},
		{"5c-restart-keeps-traffic", s.phaseRestart},
		{"6-teardown-clean", s.phaseTeardown},
	}
	for _, p := range phases {
		ps := time.Now()
		ok := t.Run(p.name, p.fn)
		t.Logf("TIMING phase %s: %v (test at %v)", p.name, time.Since(ps).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		if !ok {
			t.Fatalf("phase %s failed; the later phases build on it", p.name)
		}
	}
}

// setup starts a plugin with gossip and the shared secret on three hosts
// (h2 and h3 join h1), allocates both networks on h1 as a swarm leader
// does, creates them everywhere, and attaches containers: c1, c2, c3 on the
// encrypted network (one per host), d1, d2 on the plain one (h1, h2). It
// returns once every host has SAs and an outbound policy towards the two
// others.
func setup(t *testing.T) *suite {
	t.Helper()
	bin, err := testbed.PluginBinary()
	if err != nil {
		t.Fatalf("plugin binary: %v", err)
	}
	s := &suite{bed: testbed.New(t), bin: bin, byName: map[string]*endpoint{}}
	s.topo, err = s.bed.NewTopology(testbed.IPv4, 3)
	if err != nil {
		t.Fatalf("topology: %v", err)
	}
	if err := s.topo.WaitUnderlay(30 * time.Second); err != nil {
		t.Fatalf("underlay: %v", err)
	}
	secret := filepath.Join(s.bed.Dir(), "cluster-secret")
	if err := testbed.WriteSecret(secret); err != nil {
		t.Fatal(err)
	}
	seed := s.topo.Hosts[0].Underlay
	s.nodes = make([]*node, len(s.topo.Hosts))
	start := func(i int) error {
		h := s.topo.Hosts[i]
		args := []string{"--gossip-port", strconv.Itoa(gossipPort), "--node-name", h.Name,
			"--secret-file", secret, "--key-rotation", keyRotation.String()}
		if i > 0 {
			args = append(args, "--join", seed.String())
		}
		ps := time.Now()
		cfg := testbed.PluginConfig{Args: args, StartTimeout: pluginStart}
		p, err := h.StartPlugin(cfg)
		if err != nil {
			return fmt.Errorf("start plugin: %w", err)
		}
		t.Logf("%s: underlay %s, plugin pid %d ready in %v, log %s", h.Name, h.Underlay, p.Pid(), time.Since(ps).Round(time.Millisecond), p.LogFile)
		s.nodes[i] = &node{name: h.Name, host: h, plugin: p, cfg: cfg}
		return nil
	}
	// The seed first, then the others side by side (process starts are
	// slow under emulation).
	if err := start(0); err != nil {
		t.Fatal(err)
	}
	if err := parallel(func() error { return start(1) }, func() error { return start(2) }); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.nodes {
		caps, err := n.plugin.API.Capabilities()
		if err != nil {
			t.Fatalf("%s GetCapabilities: %v", n.name, err)
		}
		if caps.Scope != api.GlobalScope {
			t.Fatalf("%s GetCapabilities = %+v, want global scope", n.name, *caps)
		}
		if err := n.plugin.API.DiscoverNode(n.host.Underlay.String(), true); err != nil {
			t.Fatalf("%s DiscoverNew(self): %v", n.name, err)
		}
	}

	// Gossip membership and the encryption manager on every host.
	for _, n := range s.nodes {
		err := waitFor(n.name+": 3 alive cluster members and encryption running", converge, func() error {
			var cl struct {
				Members []struct{ Name, State string }
			}
			if err := n.plugin.AdminJSON("/v1/cluster", &cl); err != nil {
				return err
			}
			alive := 0
			for _, m := range cl.Members {
				if m.State == "alive" {
					alive++
				}
			}
			if alive != len(s.nodes) {
				return fmt.Errorf("members %+v", cl.Members)
			}
			st, err := s.status(n)
			if err != nil {
				return err
			}
			if st.Supported != "" {
				return fmt.Errorf("encryption unsupported: %s", st.Supported)
			}
			if len(st.Own) != 1 {
				return fmt.Errorf("own generations %+v, want 1", st.Own)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	s.enc = &network{name: "enc", id: testbed.SwarmID(), encrypted: true, pool4: encPool4, gw4: encGW4, pool6: encPool6, gw6: encGW6}
	s.plain = &network{name: "plain", id: testbed.SwarmID(), pool4: plainPool4, gw4: plainGW4}
	leader := s.nodes[0]
	for _, nw := range []*network{s.enc, s.plain} {
		userOpts := map[string]string{}
		if nw.encrypted {
			userOpts["encrypted"] = "" // `docker network create --opt encrypted`
		}
		alloc, err := leader.plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: nw.id, Options: userOpts,
			IPv4Data: []api.IPAMData{{AddressSpace: "GlobalDefault", Pool: nw.pool4.String(), Gateway: nw.gw4}}})
		if err != nil {
			t.Fatalf("AllocateNetwork %s on %s: %v", nw.name, leader.name, err)
		}
		v, ok := alloc.Options["encrypted"]
		if ok != nw.encrypted || v != "" {
			t.Fatalf("AllocateNetwork %s returned options %v: want \"encrypted\":\"\" echoed exactly when requested (%v)", nw.name, alloc.Options, nw.encrypted)
		}
		vni, err := strconv.ParseUint(alloc.Options["vxlanid_list"], 10, 32)
		if err != nil || vni == 0 || vni >= 1<<24 {
			t.Fatalf("AllocateNetwork %s options %v: want a VNI in vxlanid_list", nw.name, alloc.Options)
		}
		nw.vni, nw.options = uint32(vni), alloc.Options
		for _, n := range s.nodes {
			req := testbed.CreateNetworkRequest(nw.id, alloc.Options, nw.pool4, nw.gw4, nw.pool6, nw.gw6)
			if err := n.plugin.API.CreateNetwork(req); err != nil {
				t.Fatalf("%s CreateNetwork %s: %v", n.name, nw.name, err)
			}
		}
		t.Logf("network %s (%s): VNI %d, options %v", nw.name, nw.id, nw.vni, nw.options)
	}
	if s.enc.vni == s.plain.vni {
		t.Fatalf("both networks got VNI %d", s.enc.vni)
	}

	// One container per host at a time, the hosts side by side.
	var fns []func() error
	for i, n := range s.nodes {
		fns = append(fns, func() error {
			if _, err := s.attach(n, s.enc, fmt.Sprintf("c%d", i+1), i+1); err != nil {
				return err
			}
			if i < 2 {
				_, err := s.attach(n, s.plain, fmt.Sprintf("d%d", i+1), i+1)
				return err
			}
			return nil
		})
	}
	if err := parallel(fns...); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(s.eps, func(a, b *endpoint) int { return cmp.Compare(a.name, b.name) })

	// Every host learns the others' endpoints by gossip and programs SAs
	// and an outbound policy (not a blocking one) towards each.
	for _, n := range s.nodes {
		err := waitFor(n.name+": IPsec programmed towards both other hosts", converge, func() error {
			st, err := s.status(n)
			if err != nil {
				return err
			}
			for _, o := range s.others(n) {
				r := remoteOf(st, o.host.Underlay)
				if r == nil || r.Refs < 1 || r.Blocked || r.PolicySPI == 0 || r.SAs < 2 {
					return fmt.Errorf("towards %s: %+v (status %s)", o.name, r, dumpStatus(st))
				}
			}
			if len(st.States) != 2*len(s.others(n)) {
				return fmt.Errorf("%d SAs, want %d: %s", len(st.States), 2*len(s.others(n)), dumpStatus(st))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// attach does what dockerd does for a container on n: CreateEndpoint with
// swarm's addresses, Join, then move and configure the interface. Safe to
// call concurrently.
func (s *suite) attach(n *node, nw *network, name string, slot int) (*endpoint, error) {
	ep := &endpoint{name: name, id: testbed.RandomHex(64), node: n, net: nw}
	ep.addrs = []netip.Prefix{netip.PrefixFrom(testbed.Nth(nw.pool4, slot), nw.pool4.Bits())}
	iface := &api.EndpointInterface{Address: ep.addrs[0].String()}
	if nw.pool6.IsValid() {
		ep.addrs = append(ep.addrs, netip.PrefixFrom(testbed.Nth(nw.pool6, slot), nw.pool6.Bits()))
		iface.AddressIPv6 = ep.addrs[1].String()
	}
	resp, err := n.plugin.API.CreateEndpoint(&api.CreateEndpointRequest{NetworkID: nw.id, EndpointID: ep.id, Interface: iface})
	if err != nil {
		return nil, fmt.Errorf("%s CreateEndpoint %s: %w", n.name, name, err)
	}
	if resp.Interface == nil || resp.Interface.MacAddress == "" {
		return nil, fmt.Errorf("%s CreateEndpoint %s: response %+v has no MAC", n.name, name, resp)
	}
	mac, err := hwaddr.Parse(resp.Interface.MacAddress)
	if err != nil {
		return nil, fmt.Errorf("%s CreateEndpoint %s: MAC %q: %w", n.name, name, resp.Interface.MacAddress, err)
	}
	ep.mac = mac.String()
	if ep.ctr, err = n.host.NewContainer(name); err != nil {
		return nil, err
	}
	ep.join, err = n.plugin.API.Join(&api.JoinRequest{NetworkID: nw.id, EndpointID: ep.id, SandboxKey: ep.ctr.SandboxKey()})
	if err != nil {
		return nil, fmt.Errorf("%s Join %s: %w", n.name, name, err)
	}
	if err := ep.ctr.Attach(ep.join, ep.mac, ep.addrs...); err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	s.mu.Lock()
	s.eps = append(s.eps, ep)
	s.byName[name] = ep
	s.mu.Unlock()
	return ep, nil
}

func (s *suite) ep(name string) *endpoint { return s.byName[name] }

// ---------------------------------------------------------------------------
// 1. Connectivity.

func (s *suite) phaseConnectivity(t *testing.T) {
	encEPs := []*endpoint{s.ep("c1"), s.ep("c2"), s.ep("c3")}
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		for _, a := range encEPs {
			for _, b := range encEPs {
				if a == b {
					continue
				}
				ps := time.Now()
				if err := a.ctr.PingUntil(b.addr(fam), firstPing); err != nil {
					t.Fatalf("%v ping %s@%s -> %s@%s over the encrypted network: %v", fam, a.name, a.node.name, b.name, b.node.name, err)
				}
				if d := time.Since(ps); d > 2*time.Second {
					t.Logf("first %v ping %s -> %s answered after %v", fam, a.name, b.name, d.Round(time.Millisecond))
				}
			}
		}
	}
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		echo, err := c2.ctr.StartEcho(netip.AddrPortFrom(c2.addr(fam), echoPort))
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range []*endpoint{c1, c3} {
			ts := time.Now()
			if err := from.ctr.TCPExchange(echo.Addr, tcpSize, tcpTimeout); err != nil {
				t.Fatalf("%v TCP %s@%s -> %s: %v", fam, from.name, from.node.name, echo.Addr, err)
			}
			t.Logf("%v TCP %d KiB %s -> %s echoed in %v", fam, tcpSize>>10, from.name, c2.name, time.Since(ts).Round(time.Millisecond))
		}
		if err := echo.Close(); err != nil {
			t.Errorf("echo server %s: %v", echo.Addr, err)
		}
	}
	d1, d2 := s.ep("d1"), s.ep("d2")
	if err := d1.ctr.PingUntil(d2.addr(testbed.IPv4), firstPing); err != nil {
		t.Fatalf("ping d1 -> d2 over the plain network: %v", err)
	}
	// The two networks are separate segments.
	if err := c1.ctr.PingFails(d2.addr(testbed.IPv4), 1); err != nil {
		t.Errorf("encrypted c1 reaches plain d2: %v", err)
	}

	// What each host reports: only the encrypted VNI is guarded, both other
	// hosts are in use with an outbound SA, and the CLI says the same.
	for _, n := range s.nodes {
		st := s.mustStatus(t, n)
		if !slices.Equal(st.VNIs, []uint32{s.enc.vni}) {
			t.Errorf("%s: encryptedVNIs %v, want [%d] (not the plain network's %d)", n.name, st.VNIs, s.enc.vni, s.plain.vni)
		}
		for _, o := range s.others(n) {
			r := remoteOf(st, o.host.Underlay)
			if r == nil || r.Refs != 1 || r.Blocked || r.PolicySPI == 0 {
				t.Errorf("%s: remote %s: %+v, want refs 1 and an outbound SA", n.name, o.name, r)
				continue
			}
			if !slices.ContainsFunc(st.States, func(x encryption.StateInfo) bool {
				return x.SPI == r.PolicySPI && x.Src == n.host.Underlay && x.Dst == o.host.Underlay
			}) {
				t.Errorf("%s: the policy's SPI %#x towards %s has no state %s->%s: %+v", n.name, r.PolicySPI, o.name, n.host.Underlay, o.host.Underlay, st.States)
			}
		}
		out, err := s.cli(n, "encryption")
		if err != nil {
			t.Fatalf("%s: overlay-plugin encryption: %v", n.name, err)
		}
		var cst encryption.Status
		if err := json.Unmarshal([]byte(out), &cst); err != nil {
			t.Fatalf("%s: overlay-plugin encryption printed %q: %v", n.name, out, err)
		}
		if !slices.Equal(cst.VNIs, st.VNIs) || len(cst.Own) != len(st.Own) || cst.Own[0].Gen != st.Own[0].Gen {
			t.Errorf("%s: CLI status %s differs from the admin API's %s", n.name, dumpStatus(cst), dumpStatus(st))
		}
	}
}

// ---------------------------------------------------------------------------
// 2. ESP is really used.

// saGrowth sums, over the states src->dst, how much the counters grew from
// before to after (a state new in after counts in full).
func saGrowth(before, after []encryption.StateInfo, src, dst netip.Addr) (pkts, bytes uint64) {
	for _, a := range after {
		if a.Src != src || a.Dst != dst {
			continue
		}
		var b0, p0 uint64
		for _, b := range before {
			if b.SPI == a.SPI && b.Dst == a.Dst {
				b0, p0 = b.Bytes, b.Packets
			}
		}
		pkts += a.Packets - p0
		bytes += a.Bytes - b0
	}
	return pkts, bytes
}

func kGrowth(before, after []kState, src, dst netip.Addr) (pkts, bytes uint64) {
	conv := func(ks []kState) []encryption.StateInfo {
		var out []encryption.StateInfo
		for _, k := range ks {
			if k.Proto == "esp" && k.ReqID == encryption.ReqID {
				out = append(out, encryption.StateInfo{Src: k.Src, Dst: k.Dst, SPI: k.SPI, Bytes: k.Bytes, Packets: k.Packets})
			}
		}
		return out
	}
	return saGrowth(conv(before), conv(after), src, dst)
}

func (s *suite) phaseESP(t *testing.T) {
	c1, c2 := s.ep("c1"), s.ep("c2")
	h1, h2 := s.nodes[0], s.nodes[1]

	// The MTU: underlay minus VXLAN minus ESP, on the interfaces and in the
	// plugins' view; the plain network keeps the VXLAN-only MTU.
	for _, ep := range s.eps {
		want := plainMTU
		if ep.net.encrypted {
			want = wantMTU
		}
		links, err := ep.ctr.Links()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(links, func(l testbed.Link) bool { return l.Name == ep.ctr.Iface })
		if i < 0 {
			t.Fatalf("%s: no interface %s in %v", ep.name, ep.ctr.Iface, links)
		}
		if links[i].MTU != want {
			t.Errorf("%s (%s network): MTU %d, want %d = %d - %d (VXLAN) - %d (ESP)", ep.name, ep.net.name, links[i].MTU, want, underlayMTU, vxlanOverhead, underlayMTU-vxlanOverhead-want)
		}
		ns, err := ep.node.plugin.Network(ep.net.id)
		if err != nil {
			t.Fatal(err)
		}
		if ns.MTU != want {
			t.Errorf("%s: network %s MTU %d, want %d", ep.node.name, ep.net.name, ns.MTU, want)
		}
	}

	// A rotation switching SAs during the measurement would take the old
	// SAs' counts with them: measure between rotations.
	s.quietSchedule(t, 10*time.Second)
	before1, before2 := s.mustStatus(t, h1), s.mustStatus(t, h2)
	kb1, out, err := ipXfrmStates(h1.host.NS)
	if err != nil {
		t.Fatalf("%s: ip xfrm state: %v\n%s", h1.name, err, out)
	}
	capt, err := startCapture(h2.host.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	const pings = 20
	for i := range pings {
		if err := c1.ctr.Ping(c2.addr(testbed.IPv4), 5*time.Second); err != nil {
			capt.Stop()
			t.Fatalf("ping %d of %d c1 -> c2: %v", i+1, pings, err)
		}
	}
	// The largest packet the container may send, DF set: its ESP packet
	// must fill the underlay's 1500 bytes without fragments.
	bigErr := pingDF(c1.ctr.Netns, c2.addr(testbed.IPv4), wantMTU, 10*time.Second)
	overErr := pingDF(c1.ctr.Netns, c2.addr(testbed.IPv4), wantMTU+1, 2*time.Second)
	cs, cerr := capt.Stop()
	if cerr != nil {
		t.Fatalf("capture on %s: %v", h2.name, cerr)
	}
	if bigErr != nil {
		t.Errorf("DF ping of %d bytes (the MTU) c1 -> c2: %v", wantMTU, bigErr)
	}
	if !errors.Is(overErr, syscall.EMSGSIZE) {
		t.Errorf("DF ping of %d bytes (MTU+1) c1 -> c2: %v, want EMSGSIZE (message too long) at the sender", wantMTU+1, overErr)
	}
	after1, after2 := s.mustStatus(t, h1), s.mustStatus(t, h2)
	ka1, out, err := ipXfrmStates(h1.host.NS)
	if err != nil {
		t.Fatalf("%s: ip xfrm state: %v\n%s", h1.name, err, out)
	}

	a, b := h1.host.Underlay, h2.host.Underlay
	atLeast := uint64(pings + 1)
	for _, c := range []struct {
		who           string
		before, after []encryption.StateInfo
		src, dst      netip.Addr
	}{
		{"h1 admin API, outbound", before1.States, after1.States, a, b},
		{"h1 admin API, inbound", before1.States, after1.States, b, a},
		{"h2 admin API, inbound", before2.States, after2.States, a, b},
		{"h2 admin API, outbound", before2.States, after2.States, b, a},
	} {
		p, by := saGrowth(c.before, c.after, c.src, c.dst)
		t.Logf("%s SA %s->%s: +%d packets, +%d bytes", c.who, c.src, c.dst, p, by)
		if p < atLeast || by < atLeast*(84+vxlanOverhead) {
			t.Errorf("%s SA %s->%s grew by %d packets, %d bytes; want at least %d packets for %d pings", c.who, c.src, c.dst, p, by, atLeast, atLeast)
		}
	}
	for _, dir := range [][2]netip.Addr{{a, b}, {b, a}} {
		p, by := kGrowth(kb1, ka1, dir[0], dir[1])
		t.Logf("h1 ip -s xfrm state %s->%s: +%d packets, +%d bytes", dir[0], dir[1], p, by)
		if p < atLeast {
			t.Errorf("h1 ip -s xfrm state: SAs %s->%s grew by %d packets, want at least %d\nbefore: %+v\nafter: %+v", dir[0], dir[1], p, atLeast, kb1, ka1)
		}
	}

	t.Logf("capture on h2 %s: %d IPv4 packets, ESP %v (largest %d bytes), plaintext VXLAN by VNI %v, %d fragments",
		testbed.HostLink, cs.Total, cs.ESP, cs.ESPMaxLen, cs.VXLAN, cs.Fragments)
	for _, dir := range []addrPair{{a, b}, {b, a}} {
		if cs.ESP[dir] < pings+1 {
			t.Errorf("capture on h2: %d ESP packets %v, want at least %d", cs.ESP[dir], dir, pings+1)
		}
	}
	if n := cs.VXLAN[s.enc.vni]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d crossed the underlay", n, s.enc.vni)
	}
	if cs.Fragments != 0 {
		t.Errorf("capture on h2: %d IPv4 fragments on the underlay; the overlay MTU leaves no room for ESP", cs.Fragments)
	}
	if cs.ESPMaxLen != underlayMTU {
		t.Errorf("capture on h2: largest ESP packet %d bytes, want exactly %d for a %d-byte inner packet (MTU %d leaves the underlay MTU unused or exceeds it)",
			cs.ESPMaxLen, underlayMTU, wantMTU, wantMTU)
	}
}

// ---------------------------------------------------------------------------
// 3. Plaintext VXLAN of the encrypted VNI is dropped.

func (s *suite) phasePlaintext(t *testing.T) {
	h2, h3 := s.nodes[1], s.nodes[2]
	c2, d2 := s.ep("c2"), s.ep("d2")
	macOf := func(n *node) net.HardwareAddr {
		links, err := n.host.NS.Links()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if l.Name == testbed.HostLink {
				m, err := net.ParseMAC(l.Address)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
		}
		t.Fatalf("%s has no %s", n.name, testbed.HostLink)
		return nil
	}
	h2MAC, h3MAC := macOf(h2), macOf(h3)

	encSink, err := listenUDP(c2.ctr.Netns, netip.AddrPortFrom(c2.addr(testbed.IPv4), sinkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer encSink.Close()
	plainSink, err := listenUDP(d2.ctr.Netns, netip.AddrPortFrom(d2.addr(testbed.IPv4), sinkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer plainSink.Close()

	marker := func(kind string) []byte {
		return []byte(fmt.Sprintf("overlay-plugin encrypted test: %s %s", kind, testbed.RandomHex(16)))
	}
	// The inner frame: a UDP datagram to the target container's listener,
	// from a made-up sender of the same subnet.
	fakeMAC := net.HardwareAddr{0x02, 0x00, 0x5e, 0x10, 0x00, 0x01}
	inner := func(nw *network, target *endpoint, payload []byte) []byte {
		dmac, err := net.ParseMAC(target.mac)
		if err != nil {
			t.Fatal(err)
		}
		return vxlanPayload(nw.vni, innerFrame{DstMAC: dmac, SrcMAC: fakeMAC,
			Src: testbed.Nth(nw.pool4, 100), Dst: target.addr(testbed.IPv4), SrcPort: 5555, DstPort: sinkPort, Payload: payload})
	}
	raw := func(vxlan []byte) []byte {
		return outerFrame(h3MAC, h2MAC, h3.host.Underlay, h2.host.Underlay, 45000, vxlanPort, vxlan)
	}

	dropped0, err := nftCounter(h2.host.NS, "input")
	if err != nil {
		t.Fatal(err)
	}
	capt, err := startCapture(h2.host.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()

	// Plaintext onto the wire from h3's host namespace, below IP: h3's own
	// marking and policies do not see it. As an attacker on the underlay,
	// with a legitimate peer's address.
	const copies = 5
	encPlain, plainPlain := marker("plaintext, encrypted VNI"), marker("plaintext, plain VNI")
	if err := sendRaw(h3.host.NS, testbed.HostLink, raw(inner(s.enc, c2, encPlain)), copies, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	sentAt := time.Now()
	if err := sendRaw(h3.host.NS, testbed.HostLink, raw(inner(s.plain, d2, plainPlain)), copies, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Control: the same packet for the unencrypted network's VNI arrives.
	if !plainSink.waitCount(plainPlain, 20*time.Second) {
		t.Errorf("control failed: plaintext VXLAN for the plain network's VNI %d never reached d2 (is the crafted packet wrong?)", s.plain.vni)
	}
	// Control: the same packet for the encrypted VNI, sent through a UDP
	// socket in h3's host namespace so that h3 marks it and IPsec carries
	// it, arrives.
	encESP := marker("through IPsec, encrypted VNI")
	conn := vxlanConn(t, h3, h2)
	err = waitFor("the encrypted network's packet sent through IPsec reaches c2", 30*time.Second, func() error {
		if _, err := conn.Write(inner(s.enc, c2, encESP)); err != nil {
			return err
		}
		if encSink.waitCount(encESP, time.Second) {
			return nil
		}
		return errors.New("not received")
	})
	if err != nil {
		t.Errorf("control failed: %v", err)
	}
	// The plaintext one must never arrive, however long it is given.
	if d := 3*time.Second - time.Since(sentAt); d > 0 {
		time.Sleep(d)
	}
	cs, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if n := encSink.count(encPlain); n != 0 {
		t.Errorf("plaintext VXLAN for the encrypted VNI %d reached c2 %d times (of %d sent): the firewall lets unauthenticated traffic in", s.enc.vni, n, copies)
	}
	dropped1, err := nftCounter(h2.host.NS, "input")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h2: plaintext to encrypted VNI: received %d of %d, nft input drops +%d; to plain VNI: received %d; through IPsec: received %d; capture: VXLAN by VNI %v, ESP %v",
		encSink.count(encPlain), copies, dropped1-dropped0, plainSink.count(plainPlain), encSink.count(encESP), cs.VXLAN, cs.ESP)
	if dropped1-dropped0 < copies {
		t.Errorf("h2 nftables input drop counter grew by %d, want at least %d", dropped1-dropped0, copies)
	}
	if cs.VXLAN[s.enc.vni] < copies {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of VNI %d arrived, want the %d sent (the negative result proves nothing otherwise)", cs.VXLAN[s.enc.vni], s.enc.vni, copies)
	}
	if cs.ESP[addrPair{h3.host.Underlay, h2.host.Underlay}] == 0 {
		t.Errorf("capture on h2: the IPsec control packet did not arrive as ESP from h3: %v", cs.ESP)
	}
}

// vxlanConn is a UDP socket in from's host namespace connected to to's
// VXLAN port: what it sends is marked, and encrypted, as the plugin's
// VXLAN is. Closed when the test ends.
func vxlanConn(t *testing.T, from, to *node) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	if err := from.host.NS.Do(func() error {
		var err error
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(to.host.Underlay, vxlanPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// phaseOutsideFlush flushes h1's xfrm state and policies from outside
// (as `ip xfrm state flush` would) again and again for two seconds while
// sending VXLAN of the encrypted VNI from h1's host namespace right after
// each flush: the firewall's guard must drop it (the socket sees EPERM and
// the guard's counter grows) unless the plugin has already put a policy
// back, a capture on h2 must see none of it in clear, and the plugin must
// then program everything again.
func (s *suite) phaseOutsideFlush(t *testing.T) {
	h1, h2 := s.nodes[0], s.nodes[1]
	c1, c2 := s.ep("c1"), s.ep("c2")
	guard0, err := nftCounter(h1.host.NS, "guard")
	if err != nil {
		t.Fatal(err)
	}
	before := s.mustStatus(t, h1).Firewall
	capt, err := startCapture(h2.host.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()
	conn := vxlanConn(t, h1, h2)
	frame := vxlanPayload(s.enc.vni, innerFrame{DstMAC: net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 2},
		SrcMAC: net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 1}, Src: testbed.Nth(s.enc.pool4, 100),
		Dst: c2.addr(testbed.IPv4), SrcPort: 5555, DstPort: sinkPort, Payload: []byte("must not leave in clear")})
	flushes, refused := 0, 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); flushes++ {
		for _, what := range []string{"policy", "state"} {
			if out, err := h1.host.NS.Exec("ip", "xfrm", what, "flush"); err != nil {
				t.Fatalf("ip xfrm %s flush: %v\n%s", what, err, out)
			}
		}
		// EPERM: the guard dropped it, or the blocking policy the plugin
		// put back. EREMOTE: xfrm found the policy's SA missing.
		if _, err := conn.Write(frame); errors.Is(err, syscall.EPERM) {
			refused++
		} else if err != nil && !errors.Is(err, syscall.EREMOTE) {
			t.Fatalf("send after the flush: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Give a packet that did leave time to cross the underlay.
	time.Sleep(500 * time.Millisecond)
	cs, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	guard1, err := nftCounter(h1.host.NS, "guard")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h1: %d flushes, %d sends refused, nft guard drops +%d; capture on h2: VXLAN by VNI %v, ESP %v",
		flushes, refused, guard1-guard0, cs.VXLAN, cs.ESP)
	if n := cs.VXLAN[s.enc.vni]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d left h1 after its xfrm state was flushed", n, s.enc.vni)
	}
	if refused == 0 || guard1 == guard0 {
		t.Errorf("h1: %d of %d sends refused, guard counter +%d: the guard did not take the traffic the flush left unprotected", refused, flushes, guard1-guard0)
	}
	// Operators see it too: the admin API (and the metrics) report it.
	if after := s.mustStatus(t, h1).Firewall; after.UnprotectedDropped < before.UnprotectedDropped+(guard1-guard0) {
		t.Errorf("h1's encryption status: unprotected drops %d -> %d, want +%d", before.UnprotectedDropped, after.UnprotectedDropped, guard1-guard0)
	}
	// Nothing leaves h1 in clear (the guard), so answered pings mean that
	// the plugin has programmed SAs and policies again, towards each host
	// (the later phases start from there).
	start := time.Now()
	for _, to := range []*endpoint{c2, s.ep("c3")} {
		err = waitFor("h1 programs its SAs and policies again and c1 reaches "+to.name, 30*time.Second, func() error {
			return c1.ctr.Ping(to.addr(testbed.IPv4), 2*time.Second)
		})
		t.Logf("c1 reached %s again %v after the last flush", to.name, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
	}
}

// ---------------------------------------------------------------------------
// 4. Forced rotation under continuous traffic.

// steady reports whether every host has one generation of its own, knows
// exactly one of every other host, and holds exactly an inbound and an
// outbound SA per remote.
func (s *suite) steady() (map[*node]encryption.Status, error) {
	out := map[*node]encryption.Status{}
	for _, n := range s.nodes {
		st, err := s.status(n)
		if err != nil {
			return nil, err
		}
		if len(st.Own) != 1 {
			return nil, fmt.Errorf("%s: %d own generations", n.name, len(st.Own))
		}
		for _, o := range s.others(n) {
			r := remoteOf(st, o.host.Underlay)
			if r == nil || len(r.Generations) != 1 || r.Refs != 1 || r.Blocked || r.PolicySPI == 0 {
				return nil, fmt.Errorf("%s: remote %s: %+v", n.name, o.name, r)
			}
		}
		if len(st.States) != 2*len(s.others(n)) {
			return nil, fmt.Errorf("%s: %d SAs", n.name, len(st.States))
		}
		out[n] = st
	}
	// Everyone agrees on everyone's generation.
	for _, n := range s.nodes {
		for _, o := range s.others(n) {
			if g := remoteOf(out[n], o.host.Underlay).Generations[0].Gen; g != out[o].Own[0].Gen {
				return nil, fmt.Errorf("%s knows generation %d of %s, which has %d", n.name, g, o.name, out[o].Own[0].Gen)
			}
		}
	}
	return out, nil
}

// quietSchedule waits until the hosts are steady and no scheduled
// generation is due within margin, and returns their status. A scheduled
// rotation due sooner, or in progress, is waited out (in the rotation
// phase under the running streams, whose loss check then covers it too).
// A new generation switches no SA before it activates, Lead after it is
// due, so margin plus Lead is the time without SA changes.
func (s *suite) quietSchedule(t *testing.T, margin time.Duration) map[*node]encryption.Status {
	t.Helper()
	deadline := time.Now().Add(keyRotation + lead + grace + 60*time.Second)
	logged := false
	for {
		st, err := s.steady()
		if err == nil {
			next := s.nextDue(st)
			if time.Until(next) > margin {
				return st
			}
			t.Logf("a scheduled generation is due in %v: letting it complete first", time.Until(next).Round(time.Millisecond))
			time.Sleep(time.Until(next) + lead + grace)
		} else if !logged {
			t.Logf("waiting for a key rotation in progress to complete: %v", err)
			logged = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("hosts not steady with no scheduled rotation due within %v: %v", margin, err)
		}
		time.Sleep(poll)
	}
}

// nextDue is when the first host of a steady cluster (one generation
// each) creates its next scheduled generation.
func (s *suite) nextDue(st map[*node]encryption.Status) time.Time {
	var next time.Time
	for _, n := range s.nodes {
		due := st[n].Own[0].ActivateAt.Add(keyRotation - lead)
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return next
}

// startStreams starts the sequenced streams c1->c2 and c3->c1, waits
// until both echo, and returns what stops them and tallies (once).
func (s *suite) startStreams(t *testing.T) (stopAll func() []streamResult) {
	t.Helper()
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	var streams []*stream
	stopped := false
	stopAll = func() []streamResult {
		var rs []streamResult
		if !stopped {
			stopped = true
			for _, st := range streams {
				rs = append(rs, st.Stop(3*time.Second))
			}
		}
		return rs
	}
	for _, p := range [][2]*endpoint{{c1, c2}, {c3, c1}} {
		st, err := startStream(p[0].name+"->"+p[1].name, p[0].ctr.Netns, p[1].ctr.Netns,
			netip.AddrPortFrom(p[1].addr(testbed.IPv4), streamPort), streamEvery)
		if err != nil {
			stopAll()
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := waitFor("both streams echo", 30*time.Second, func() error {
		for _, st := range streams {
			if _, echoed := st.Progress(); echoed == 0 {
				return fmt.Errorf("stream %s: no echo yet", st.Name)
			}
		}
		return nil
	}); err != nil {
		stopAll()
		t.Fatal(err)
	}
	return stopAll
}

func (s *suite) phaseRotation(t *testing.T) {
	stopAll := s.startStreams(t)
	defer stopAll()

	// Margin: forcing the rotation on the three hosts takes a few process
	// starts; a scheduled generation created meanwhile would make three.
	// Reading the counters takes process starts too, which a loaded
	// emulator stretches past the margin: then the quiet window is
	// looked for again.
	var pre map[*node]encryption.Status
	stat0 := map[*node]map[string]uint64{}
	drop0 := map[*node]uint64{}
	for {
		pre = s.quietSchedule(t, 10*time.Second)
		for _, n := range s.nodes {
			var err error
			if stat0[n], err = xfrmStat(n.host.NS); err != nil {
				t.Fatal(err)
			}
			if drop0[n], err = nftCounter(n.host.NS, "input"); err != nil {
				t.Fatal(err)
			}
		}
		left := time.Until(s.nextDue(pre))
		if left > 5*time.Second {
			break
		}
		t.Logf("reading the counters left %v before a scheduled generation: waiting for it", left.Round(time.Millisecond))
	}
	s.preRotation = pre
	// A timeline of what each host programs, for diagnosing loss.
	lastPol := map[[2]*node]uint32{}
	lastSAs := map[*node]string{}
	for _, n := range s.nodes {
		for _, o := range s.others(n) {
			lastPol[[2]*node{n, o}] = remoteOf(pre[n], o.host.Underlay).PolicySPI
		}
		lastSAs[n] = saList(pre[n].States)
		t.Logf("%s before rotation: SAs %s", n.name, lastSAs[n])
	}
	var rotateStart time.Time
	rotated := map[*node]time.Time{}
	for i, n := range s.nodes {
		if i == 0 {
			rotateStart = time.Now()
		}
		out, err := s.cli(n, "rotate-keys")
		if err != nil {
			t.Fatalf("%s: overlay-plugin rotate-keys: %v", n.name, err)
		}
		rotated[n] = time.Now()
		if !strings.Contains(out, "new key generation") {
			t.Errorf("%s: rotate-keys printed %q", n.name, out)
		}
	}
	t.Logf("rotate-keys on 3 hosts took %v", time.Since(rotateStart).Round(time.Millisecond))

	// Watch every host until its new generation is the only one left and
	// every host uses it: own generations 1 -> 2 -> 1, policy SPIs changed.
	counts := map[*node][]int{}
	for _, n := range s.nodes {
		counts[n] = []int{len(pre[n].Own)}
	}
	newGen := map[*node]encryption.PublicKeyInfo{}
	var post map[*node]encryption.Status
	deadline := time.Now().Add(lead + grace + 90*time.Second)
	for {
		all := map[*node]encryption.Status{}
		for _, n := range s.nodes {
			st, err := s.status(n)
			if err != nil {
				t.Fatal(err)
			}
			all[n] = st
			c := len(st.Own)
			if h := counts[n]; len(h) == 0 || h[len(h)-1] != c {
				counts[n] = append(counts[n], c)
				t.Logf("%s: %d own generation(s) at rotate+%v: %+v", n.name, c, time.Since(rotated[n]).Round(time.Millisecond), st.Own)
			}
			for _, o := range s.others(n) {
				if r := remoteOf(st, o.host.Underlay); r != nil && r.PolicySPI != lastPol[[2]*node{n, o}] {
					t.Logf("%s: %s policy towards %s %#x -> %#x (blocked %v)", time.Now().Format("15:04:05.000"), n.name, o.name, lastPol[[2]*node{n, o}], r.PolicySPI, r.Blocked)
					lastPol[[2]*node{n, o}] = r.PolicySPI
				}
			}
			if l := saList(st.States); l != lastSAs[n] {
				t.Logf("%s: %s SAs %s", time.Now().Format("15:04:05.000"), n.name, l)
				lastSAs[n] = l
			}
			if c == 2 && newGen[n].Gen == 0 {
				newGen[n] = st.Own[1]
			}
			if c > 2 {
				t.Fatalf("%s: %d own generations %+v: a scheduled rotation overlapped the forced one", n.name, c, st.Own)
			}
		}
		done := true
		for _, n := range s.nodes {
			st := all[n]
			if newGen[n].Gen == 0 || len(st.Own) != 1 || st.Own[0].Gen != newGen[n].Gen {
				done = false
				break
			}
			for _, o := range s.others(n) {
				r := remoteOf(st, o.host.Underlay)
				if r == nil || len(r.Generations) != 1 || r.Generations[0].Gen != newGen[o].Gen || r.Blocked || r.PolicySPI == 0 ||
					r.PolicySPI == remoteOf(pre[n], o.host.Underlay).PolicySPI {
					done = false
				}
			}
			if len(st.States) != 2*len(s.others(n)) {
				done = false
			}
		}
		if done {
			post = all
			break
		}
		if time.Now().After(deadline) {
			for _, n := range s.nodes {
				t.Logf("%s: %s", n.name, dumpStatus(all[n]))
			}
			t.Fatalf("rotation did not complete within %v of rotate-keys: own generation counts %v", lead+grace+90*time.Second, counts)
		}
		time.Sleep(poll)
	}
	t.Logf("rotation complete on every host %v after the first rotate-keys", time.Since(rotateStart).Round(time.Millisecond))
	for _, n := range s.nodes {
		if !slices.Equal(counts[n], []int{1, 2, 1}) {
			t.Errorf("%s: own generation counts went %v, want [1 2 1]", n.name, counts[n])
		}
		// The new generation activates Lead after it was published.
		act := newGen[n].ActivateAt
		lo, hi := rotateStart.Add(lead-time.Second), rotated[n].Add(lead+time.Second)
		if act.Before(lo) || act.After(hi) {
			t.Errorf("%s: new generation activates at %v, want rotate-keys + %v (between %v and %v)", n.name, act, lead, lo, hi)
		}
		for _, o := range s.others(n) {
			t.Logf("%s: policy SPI towards %s %#x -> %#x", n.name, o.name,
				remoteOf(pre[n], o.host.Underlay).PolicySPI, remoteOf(post[n], o.host.Underlay).PolicySPI)
		}
	}
	s.postRotation = post
	s.newGen = map[*node]uint64{}
	for n, g := range newGen {
		s.newGen[n] = g.Gen
	}

	// A little traffic on the new SAs only, then the tally.
	time.Sleep(2 * time.Second)
	for _, r := range stopAll() {
		t.Logf("%s", r)
		if !r.Lossless() {
			t.Errorf("packets lost or duplicated across the rotation: %s", r)
		}
	}
	for _, n := range s.nodes {
		st, err := xfrmStat(n.host.NS)
		if err != nil {
			t.Fatal(err)
		}
		drop, err := nftCounter(n.host.NS, "input")
		if err != nil {
			t.Fatal(err)
		}
		d := statDelta(stat0[n], st)
		t.Logf("%s during the rotation: xfrm_stat errors %v, nft plaintext drops +%d", n.name, d, drop-drop0[n])
		if len(d) != 0 || drop != drop0[n] {
			t.Errorf("%s: IPsec errors during the rotation: xfrm_stat %v, nft drops +%d", n.name, d, drop-drop0[n])
		}
	}
}

// saList renders states compactly: src->dst:spi, sorted.
func saList(states []encryption.StateInfo) string {
	var l []string
	for _, x := range states {
		l = append(l, fmt.Sprintf("h%d->h%d:%08x", x.Src.As4()[3], x.Dst.As4()[3], x.SPI))
	}
	slices.Sort(l)
	return strings.Join(l, " ")
}

// ---------------------------------------------------------------------------
// 5. The retired generations are gone.

func (s *suite) phaseRetired(t *testing.T) {
	if s.preRotation == nil || s.postRotation == nil {
		t.Fatal("no rotation recorded")
	}
	for _, n := range s.nodes {
		old := s.preRotation[n].Own[0].Gen
		for _, m := range s.nodes {
			st := s.mustStatus(t, m)
			if m == n {
				if slices.ContainsFunc(st.Own, func(g encryption.PublicKeyInfo) bool { return g.Gen == old }) {
					t.Errorf("%s still lists its retired generation %d: %+v", n.name, old, st.Own)
				}
				continue
			}
			if r := remoteOf(st, n.host.Underlay); r != nil && slices.ContainsFunc(r.Generations, func(g encryption.PublicKeyInfo) bool { return g.Gen == old }) {
				t.Errorf("%s still knows %s's retired generation %d: %+v", m.name, n.name, old, r.Generations)
			}
		}
	}
	for _, n := range s.nodes {
		st := s.mustStatus(t, n)
		oldSPIs := map[uint32]bool{}
		for _, x := range s.preRotation[n].States {
			oldSPIs[x.SPI] = true
		}
		apiSPIs := map[uint32]bool{}
		for _, x := range st.States {
			apiSPIs[x.SPI] = true
			if oldSPIs[x.SPI] {
				t.Errorf("%s: SA %s->%s SPI %#x predates the rotation: the retired generation is still in use", n.name, x.Src, x.Dst, x.SPI)
			}
		}
		// Independently: the kernel's states and policies.
		ks, out, err := ipXfrmStates(n.host.NS)
		if err != nil {
			t.Fatalf("%s: %v\n%s", n.name, err, out)
		}
		kSPIs := map[uint32]bool{}
		for _, k := range ks {
			kSPIs[k.SPI] = true
			if oldSPIs[k.SPI] {
				t.Errorf("%s: ip xfrm state still holds SPI %#x of before the rotation\n%s", n.name, k.SPI, out)
			}
			if k.Proto != "esp" || k.ReqID != encryption.ReqID {
				t.Errorf("%s: unexpected state %+v", n.name, k)
			}
		}
		if !maps.Equal(kSPIs, apiSPIs) {
			t.Errorf("%s: ip xfrm state SPIs %v, admin API %v\n%s", n.name, slices.Sorted(maps.Keys(kSPIs)), slices.Sorted(maps.Keys(apiSPIs)), out)
		}
		pols, pout, err := ipXfrmPolicies(n.host.NS)
		if err != nil {
			t.Fatalf("%s: %v\n%s", n.name, err, pout)
		}
		for _, o := range s.others(n) {
			r := remoteOf(st, o.host.Underlay)
			i := slices.IndexFunc(pols, func(p kPolicy) bool {
				return p.Dir == "out" && p.HasMark && p.Mark == encryption.Mark && p.Dst == o.host.Underlay.String()+"/32"
			})
			if i < 0 {
				t.Errorf("%s: no outbound policy of ours to %s in\n%s", n.name, o.name, pout)
				continue
			}
			if pols[i].TmplSPI != r.PolicySPI || pols[i].TmplProto != "esp" {
				t.Errorf("%s: kernel policy to %s uses %s SPI %#x, admin API says %#x", n.name, o.name, pols[i].TmplProto, pols[i].TmplSPI, r.PolicySPI)
			}
			// The receiver holds the sender's outbound SA.
			ost := s.mustStatus(t, o)
			if !slices.ContainsFunc(ost.States, func(x encryption.StateInfo) bool {
				return x.SPI == r.PolicySPI && x.Src == n.host.Underlay && x.Dst == o.host.Underlay
			}) {
				t.Errorf("%s sends to %s with SPI %#x, which %s has no inbound SA for: %+v", n.name, o.name, r.PolicySPI, o.name, ost.States)
			}
		}
		if st.LastError != "" {
			t.Errorf("%s: lastError %q", n.name, st.LastError)
		}
	}
	// Traffic still flows on the new SAs.
	c1, c2, c3 := s.ep("c1"), s.ep("c2"), s.ep("c3")
	for _, p := range [][2]*endpoint{{c1, c2}, {c2, c3}, {c3, c1}} {
		if err := p[0].ctr.PingUntil(p[1].addr(testbed.IPv4), 10*time.Second); err != nil {
			t.Errorf("after rotation: %v", err)
		}
	}
	t.Log("the retired private keys' bytes being wiped is checked in process by encryption.TestRetiredKeyLeavesNoCopyInMemory")
}

// ---------------------------------------------------------------------------
// 6. Teardown leaves nothing behind.

// phaseRestart stops h1's plugin and starts it again, as `docker plugin
// disable`/`enable` does, while sequenced streams run through it (c1->c2,
// c3->c1). Its sandboxes are held as a managed plugin's host mount holds
// them. The new run takes the previous one's IPsec state over, so no
// packet is lost, none crosses the underlay in clear, and once h1's
// inherited generation has retired (Lead+Grace after the start) none of
// the previous run's SAs is left.
func (s *suite) phaseRestart(t *testing.T) {
	h1, h2 := s.nodes[0], s.nodes[1]
	pre := s.quietSchedule(t, lead+grace+20*time.Second)
	previous := map[uint32]bool{}
	for _, st := range pre[h1].States {
		previous[st.SPI] = true
	}
	if err := h1.plugin.HoldSandboxes(); err != nil {
		t.Fatal(err)
	}
	capt, err := startCapture(h2.host.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()
	stopAll := s.startStreams(t)
	defer stopAll()

	// The worst case for the handover: h1's peers reach its new run only
	// after Lead (they re-join a node that left every 10 s), when a
	// generation the new run made at start would already be active.
	uncut, err := cutGossip(s.bed, h1.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer uncut()
	down := time.Now()
	if err := h1.plugin.Stop(0); err != nil {
		t.Fatalf("stop h1's plugin: %v", err)
	}
	time.Sleep(time.Second)
	p, err := h1.host.StartPlugin(h1.cfg)
	if err != nil {
		t.Fatalf("start h1's plugin again: %v", err)
	}
	h1.plugin = p
	t.Logf("h1's plugin stopped and ready again (pid %d) in %v", p.Pid(), time.Since(down).Round(time.Millisecond))
	time.Sleep(lead + 2*time.Second)
	if err := uncut(); err != nil {
		t.Fatal(err)
	}
	t.Logf("h1 cut off from gossip for %v across the restart", time.Since(down).Round(time.Millisecond))
	// Ready means the driver serves; the control plane, and with it the
	// encryption side, starts just after.
	if err := waitFor("h1's new run takes the encrypted network over", 20*time.Second, func() error {
		if log := p.LogTail(200); !strings.Contains(log, "took over the previous run's IPsec state") || !strings.Contains(log, "adopted encrypted sandbox guarded again") {
			return errors.New("not in its log yet")
		}
		return nil
	}); err != nil {
		t.Errorf("%v; log tail:\n%s", err, p.LogTail(60))
	}
	err = waitFor("h1 back to one generation, none of the previous run's SAs left", lead+grace+60*time.Second, func() error {
		st, err := s.status(h1)
		if err != nil {
			return err
		}
		if len(st.Own) != 1 || st.Own[0].Gen == pre[h1].Own[0].Gen {
			return fmt.Errorf("own generations %+v", st.Own)
		}
		for _, sa := range st.States {
			if previous[sa.SPI] {
				return fmt.Errorf("SA %#x of the previous run still installed", sa.SPI)
			}
		}
		for _, o := range s.others(h1) {
			if r := remoteOf(st, o.host.Underlay); r == nil || r.Blocked || r.PolicySPI == 0 || previous[r.PolicySPI] {
				return fmt.Errorf("towards %s: %+v", o.name, r)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h1 on its own keys only %v after the stop", time.Since(down).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	for _, r := range stopAll() {
		t.Logf("%s", r)
		if !r.Lossless() {
			t.Errorf("packets lost or duplicated across the plugin restart: %s", r)
		}
	}
	cs, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capture on h2 during the restart: VXLAN by VNI %v, ESP %v", cs.VXLAN, cs.ESP)
	if n := cs.VXLAN[s.enc.vni]; n != 0 {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of the encrypted VNI %d crossed the underlay", n, s.enc.vni)
	}
}

// phaseContainerBack: c1, h1's only container on the encrypted network,
// leaves and joins again while h1 is cut off from gossip, so h2 never sees
// it go and keeps its inbound SA, with the anti-replay window that has seen
// h1's sequence numbers so far. h1's sandbox and its references on h2 go
// and come back: the outbound SA must be the same instance, numbering on.
// Installed again, it would count from 1, and h2 would drop it all as
// replays until the next key generation.
func (s *suite) phaseContainerBack(t *testing.T) {
	h1 := s.nodes[0]
	c1, c2 := s.ep("c1"), s.ep("c2")
	// A generation activating meanwhile would bring fresh SAs and hide a
	// reinstalled one. (Before the restart phase, which puts h1's
	// schedule out of step with the others', leaving no such window.)
	s.quietSchedule(t, 30*time.Second)
	// h2's replay window must have seen more of the SA's numbers than the
	// pings below send.
	if err := sendUDP(c1.ctr.Netns, netip.AddrPortFrom(c2.addr(testbed.IPv4), sinkPort), 500); err != nil {
		t.Fatal(err)
	}
	for _, st := range s.mustStatus(t, s.nodes[1]).States {
		if st.Src == h1.host.Underlay {
			t.Logf("h2's inbound SA %#x from h1 has counted %d packets", st.SPI, st.Packets)
		}
	}
	uncut, err := cutGossip(s.bed, h1.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer uncut()
	if err := c1.ctr.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := h1.plugin.API.Leave(&api.LeaveRequest{NetworkID: c1.net.id, EndpointID: c1.id}); err != nil {
		t.Fatalf("Leave c1: %v", err)
	}
	st := s.mustStatus(t, h1)
	if r := remoteOf(st, s.nodes[1].host.Underlay); r == nil || r.Refs != 0 || r.PolicySPI != 0 || r.Blocked || r.SAs == 0 {
		t.Errorf("h1 after c1 left: towards h2 %+v; want no reference and no policy, the SAs kept", r)
	}
	join, err := h1.plugin.API.Join(&api.JoinRequest{NetworkID: c1.net.id, EndpointID: c1.id, SandboxKey: c1.ctr.SandboxKey()})
	if err != nil {
		t.Fatalf("Join c1 again: %v", err)
	}
	c1.join = join
	if err := c1.ctr.Attach(join, c1.mac, c1.addrs...); err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]*endpoint{{c1, c2}, {c2, c1}} {
		// Seconds, not firstPing: an SA counting from 1 would fail for
		// as long as h2 has seen packets from h1 on it.
		if err := pair[0].ctr.PingUntil(pair[1].addr(testbed.IPv4), 10*time.Second); err != nil {
			stat, _ := s.nodes[1].host.NS.Exec("cat", "/proc/net/xfrm_stat")
			t.Fatalf("ping %s -> %s after c1 came back, h2 unaware it ever left: %v; h2's xfrm_stat:\n%s", pair[0].name, pair[1].name, err, stat)
		}
	}
	if err := uncut(); err != nil {
		t.Fatal(err)
	}
}

// leftovers lists the IPsec and nftables state left on n.
func (s *suite) leftovers(n *node, checkAPI bool) error {
	var problems []string
	ks, out, err := ipXfrmStates(n.host.NS)
	if err != nil {
		return err
	}
	if len(ks) != 0 {
		problems = append(problems, "xfrm states:\n"+out)
	}
	pols, pout, err := ipXfrmPolicies(n.host.NS)
	if err != nil {
		return err
	}
	for _, p := range pols {
		if p.HasMark && p.Mark == encryption.Mark {
			problems = append(problems, "our xfrm policy:\n"+p.Text)
		}
	}
	if len(pols) != 0 && !slices.ContainsFunc(problems, func(s string) bool { return strings.HasPrefix(s, "our") }) {
		problems = append(problems, "foreign xfrm policies (nobody else runs IPsec here):\n"+pout)
	}
	tables, err := nftTables(n.host.NS)
	if err != nil {
		return err
	}
	if slices.Contains(tables, "inet overlay_plugin") {
		problems = append(problems, fmt.Sprintf("nftables tables %v", tables))
	}
	if checkAPI {
		st, err := s.status(n)
		if err != nil {
			return err
		}
		if len(st.VNIs) != 0 || len(st.States) != 0 {
			problems = append(problems, "admin API: "+dumpStatus(st))
		}
		for _, r := range st.Remotes {
			if r.Refs != 0 || r.SAs != 0 || r.PolicySPI != 0 || r.Blocked {
				problems = append(problems, fmt.Sprintf("admin API remote %+v", r))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s:\n%s", n.name, strings.Join(problems, "\n"))
	}
	return nil
}

func (s *suite) phaseTeardown(t *testing.T) {
	// What dockerd does as containers stop and the networks go; the hosts
	// side by side.
	err := s.forNodes(func(n *node) error {
		for _, ep := range s.eps {
			if ep.node != n {
				continue
			}
			if err := ep.ctr.Detach(); err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
			if err := n.plugin.API.Leave(&api.LeaveRequest{NetworkID: ep.net.id, EndpointID: ep.id}); err != nil {
				return fmt.Errorf("%s Leave %s: %w", n.name, ep.name, err)
			}
			if err := n.plugin.API.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: ep.net.id, EndpointID: ep.id}); err != nil {
				return fmt.Errorf("%s DeleteEndpoint %s: %w", n.name, ep.name, err)
			}
		}
		for _, nw := range []*network{s.enc, s.plain} {
			if err := n.plugin.API.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: nw.id}); err != nil {
				return fmt.Errorf("%s DeleteNetwork %s: %w", n.name, nw.name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, nw := range []*network{s.enc, s.plain} {
		if err := s.nodes[0].plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: nw.id}); err != nil {
			t.Fatalf("FreeNetwork %s: %v", nw.name, err)
		}
	}
	err = s.forNodes(func(n *node) error {
		var errs []error
		errs = append(errs, waitFor("no IPsec or firewall state left", 30*time.Second+encryption.Linger, func() error { return s.leftovers(n, true) }))
		if nets, err := n.plugin.Admin.Networks(); err != nil || len(nets) != 0 {
			errs = append(errs, fmt.Errorf("%s: networks %+v, %v; want none", n.name, nets, err))
		}
		if extra, err := n.host.ExtraLinks(); err != nil || len(extra) != 0 {
			errs = append(errs, fmt.Errorf("%s: links left in the host namespace: %v, %v", n.name, extra, err))
		}
		// A clean stop must not leave anything either.
		if err := n.plugin.Stop(0); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop plugin: %w", n.name, err))
		}
		if err := s.leftovers(n, false); err != nil {
			errs = append(errs, fmt.Errorf("after stopping the plugin: %w", err))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Error(err)
	}
}
