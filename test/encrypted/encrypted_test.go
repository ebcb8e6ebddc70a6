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
// This file is the suite's use of testbed.Cluster; each phase has a file of
// its own.
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
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/netlinkxfrm"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m, "encrypted") }

var espReq = testbed.NewRequirement("encrypted",
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

// The overlays, as `docker network create` and swarm's IPAM make them.
var (
	encSpec = testbed.NetworkSpec{Name: "enc", Options: map[string]string{"encrypted": ""}, // --opt encrypted
		Pool4: netip.MustParsePrefix("203.0.113.0/25"), Gw4: "203.0.113.126/25",
		Pool6: netip.MustParsePrefix("2001:db8:e0::/64"), Gw6: "2001:db8:e0::fffe/64"}
	plainSpec = testbed.NetworkSpec{Name: "plain",
		Pool4: netip.MustParsePrefix("203.0.113.128/25"), Gw4: "203.0.113.254/25"}
)

// endpoint is a container's endpoint, by the suite's name for it.
type endpoint struct {
	*testbed.Endpoint
	name string
	node *testbed.Node
	net  *testbed.Network
}

func (e *endpoint) addr(f testbed.Family) netip.Addr {
	a, ok := e.Ctr.Addr(f)
	if !ok {
		panic(fmt.Sprintf("%s has no %v address", e.name, f))
	}
	return a
}

// suite is the cluster under test, shared by the phases.
type suite struct {
	*testbed.Cluster
	bin        string
	enc, plain *testbed.Network
	mu         sync.Mutex // guards eps and byName while setup attaches in parallel
	eps        []*endpoint
	byName     map[string]*endpoint

	// From the rotation phase, for the next one.
	preRotation  map[*testbed.Node]encryption.Status
	postRotation map[*testbed.Node]encryption.Status
	newGen       map[*testbed.Node]uint64
}

func (s *suite) mustStatus(t *testing.T, n *testbed.Node) encryption.Status {
	t.Helper()
	st, err := n.Plugin.EncryptionStatus()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cli runs an overlay-plugin client subcommand against n's admin socket.
func (s *suite) cli(n *testbed.Node, args ...string) (string, error) {
	return testbed.Run(append(append([]string{s.bin}, args...), "--admin-socket", n.Plugin.AdminSocket)...)
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
		{"5d-esp-filtered-named", s.phaseESPFiltered},
		{"5e-secret-roll-lossless", s.phaseSecretRoll},
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
	tc, err := testbed.New(t).NewCluster(testbed.ClusterConfig{UnderlayWait: 30 * time.Second,
		Gossip: true, Secret: true, SecretPerHost: true, KeyRotation: keyRotation,
		Plugin:        testbed.PluginConfig{StartTimeout: pluginStart},
		ParallelStart: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{Cluster: tc, bin: bin, byName: map[string]*endpoint{}}

	// Gossip membership and the encryption manager on every host.
	if err := s.WaitMembers(nil, converge, "3 hosts, h2 and h3 joined h1"); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitEncryption(converge); err != nil {
		t.Fatal(err)
	}

	if s.enc, err = s.CreateNetwork(encSpec); err != nil {
		t.Fatal(err)
	}
	if s.plain, err = s.CreateNetwork(plainSpec); err != nil {
		t.Fatal(err)
	}
	if s.enc.VNI == s.plain.VNI {
		t.Fatalf("both networks got VNI %d", s.enc.VNI)
	}

	// One container per host at a time, the hosts side by side.
	err = s.ForNodes(func(n *testbed.Node) error {
		i := slices.Index(s.Nodes, n)
		if _, err := s.attach(n, s.enc, fmt.Sprintf("c%d", i+1), i+1); err != nil {
			return err
		}
		if i < 2 {
			_, err := s.attach(n, s.plain, fmt.Sprintf("d%d", i+1), i+1)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(s.eps, func(a, b *endpoint) int { return cmp.Compare(a.name, b.name) })

	// Every host learns the others' endpoints by gossip and programs SAs
	// and an outbound policy (not a blocking one) towards each.
	if err := s.WaitIPsec(converge); err != nil {
		t.Fatal(err)
	}
	return s
}

// attach starts a container on n attached to nw at slot of its pools, as
// dockerd does. Safe to call concurrently.
func (s *suite) attach(n *testbed.Node, nw *testbed.Network, name string, slot int) (*endpoint, error) {
	tep, err := s.RunContainer(n, nw, name, nw.Addrs(slot)...)
	if err != nil {
		return nil, err
	}
	ep := &endpoint{Endpoint: tep, name: name, node: n, net: nw}
	s.mu.Lock()
	s.eps = append(s.eps, ep)
	s.byName[name] = ep
	s.mu.Unlock()
	return ep, nil
}

func (s *suite) ep(name string) *endpoint { return s.byName[name] }
