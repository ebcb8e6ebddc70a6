package encrypted

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// 3. Plaintext VXLAN of the encrypted VNI is dropped.

func (s *suite) phasePlaintext(t *testing.T) {
	h2, h3 := s.Nodes[1], s.Nodes[2]
	c2, d2 := s.ep("c2"), s.ep("d2")
	macOf := func(n *testbed.Node) net.HardwareAddr {
		links, err := n.NS.Links()
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
		t.Fatalf("%s has no %s", n.Name, testbed.HostLink)
		return nil
	}
	h2MAC, h3MAC := macOf(h2), macOf(h3)

	encSink, err := listenUDP(c2.Ctr.Netns, netip.AddrPortFrom(c2.addr(testbed.IPv4), sinkPort))
	if err != nil {
		t.Fatal(err)
	}
	defer encSink.Close()
	plainSink, err := listenUDP(d2.Ctr.Netns, netip.AddrPortFrom(d2.addr(testbed.IPv4), sinkPort))
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
	inner := func(nw *testbed.Network, target *endpoint, payload []byte) []byte {
		dmac, err := net.ParseMAC(target.MAC)
		if err != nil {
			t.Fatal(err)
		}
		return vxlanPayload(nw.VNI, innerFrame{DstMAC: dmac, SrcMAC: fakeMAC,
			Src: testbed.Nth(nw.Pool4, 100), Dst: target.addr(testbed.IPv4), SrcPort: 5555, DstPort: sinkPort, Payload: payload})
	}
	raw := func(vxlan []byte) []byte {
		return outerFrame(h3MAC, h2MAC, h3.Underlay, h2.Underlay, 45000, vxlanPort, vxlan)
	}

	dropped0, err := nftCounter(h2.NS, "input")
	if err != nil {
		t.Fatal(err)
	}
	capt, err := testbed.StartCapture(h2.NS, testbed.HostLink, vxlanPort)
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()

	// Plaintext onto the wire from h3's host namespace, below IP: h3's own
	// marking and policies do not see it. As an attacker on the underlay,
	// with a legitimate peer's address.
	const copies = 5
	encPlain, plainPlain := marker("plaintext, encrypted VNI"), marker("plaintext, plain VNI")
	if err := sendRaw(h3.NS, testbed.HostLink, raw(inner(s.enc, c2, encPlain)), copies, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	sentAt := time.Now()
	if err := sendRaw(h3.NS, testbed.HostLink, raw(inner(s.plain, d2, plainPlain)), copies, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Control: the same packet for the unencrypted network's VNI arrives.
	if !plainSink.waitCount(plainPlain, 20*time.Second) {
		t.Errorf("control failed: plaintext VXLAN for the plain network's VNI %d never reached d2 (is the crafted packet wrong?)", s.plain.VNI)
	}
	// Control: the same packet for the encrypted VNI, sent through a UDP
	// socket in h3's host namespace so that h3 marks it and IPsec carries
	// it, arrives.
	encESP := marker("through IPsec, encrypted VNI")
	conn := vxlanConn(t, h3, h2)
	err = wait.Until(30*time.Second, poll, func() error {
		if _, err := conn.Write(inner(s.enc, c2, encESP)); err != nil {
			return err
		}
		if encSink.waitCount(encESP, time.Second) {
			return nil
		}
		return errors.New("not received")
	})
	if err != nil {
		t.Errorf("control failed: the encrypted network's packet sent through IPsec reaches c2: %v", err)
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
		t.Errorf("plaintext VXLAN for the encrypted VNI %d reached c2 %d times (of %d sent): the firewall lets unauthenticated traffic in", s.enc.VNI, n, copies)
	}
	dropped1, err := nftCounter(h2.NS, "input")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h2: plaintext to encrypted VNI: received %d of %d, nft input drops +%d; to plain VNI: received %d; through IPsec: received %d; capture: VXLAN by VNI %v, ESP %v",
		encSink.count(encPlain), copies, dropped1-dropped0, plainSink.count(plainPlain), encSink.count(encESP), cs.VXLAN, cs.ESP)
	if dropped1-dropped0 < copies {
		t.Errorf("h2 nftables input drop counter grew by %d, want at least %d", dropped1-dropped0, copies)
	}
	if cs.VXLAN[s.enc.VNI] < copies {
		t.Errorf("capture on h2: %d plaintext VXLAN packets of VNI %d arrived, want the %d sent (the negative result proves nothing otherwise)", cs.VXLAN[s.enc.VNI], s.enc.VNI, copies)
	}
	if cs.ESP[testbed.AddrPair{Src: h3.Underlay, Dst: h2.Underlay}] == 0 {
		t.Errorf("capture on h2: the IPsec control packet did not arrive as ESP from h3: %v", cs.ESP)
	}
}

// vxlanConn is a UDP socket in from's host namespace connected to to's
// VXLAN port: what it sends is marked, and encrypted, as the plugin's
// VXLAN is. Closed when the test ends.
func vxlanConn(t *testing.T, from, to *testbed.Node) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	if err := from.NS.Do(func() error {
		var err error
		conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(to.Underlay, vxlanPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
