package dockere2e

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// DataPathPort is the swarm's data-path port as the manager's engine says
// it (4789 unless `swarm init --data-path-port`, E2E_DATA_PATH_PORT): the
// UDP port of VXLAN on the underlay, Docker's and, following it, the
// plugin's.
func (c *Check) DataPathPort() (uint16, error) {
	out, err := c.manager().Docker("info", "-f", "{{.Swarm.Cluster.DataPathPort}}")
	if err != nil {
		return 0, err
	}
	p, err := strconv.ParseUint(out, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("the manager's data-path port %q: %w", out, err)
	}
	if p == 0 {
		p = 4789 // Docker's default, which /info may show as 0
	}
	return uint16(p), nil
}

// Wire watches the underlay where every node's traffic passes (the switch
// of scripts/e2e/lib.sh): what an eavesdropper sees, not a node's stack.
type Wire struct {
	c   *Check
	cap *testbed.Capture
}

// WatchWire starts the capture; without the environment's wire (a Vagrant
// underlay that does not flood every frame here) it says so and returns
// a Wire that judges nothing.
func (c *Check) WatchWire() (*Wire, error) {
	w := &Wire{c: c}
	if c.WireNetns == "" || c.WireIf == "" {
		c.T.Logf("note: no %s/%s: the underlay capture is not checked here", envWireNetns, envWireIf)
		return w, nil
	}
	port, err := c.DataPathPort()
	if err != nil {
		return nil, err
	}
	w.cap, err = testbed.StartBridgeCapture(&testbed.Netns{Name: c.WireNetns}, c.WireIf, port)
	if err != nil {
		return nil, err
	}
	c.T.Cleanup(func() { _, _ = w.cap.Stop() })
	c.T.Logf("capturing VXLAN and ESP on the underlay (%s in %s)", c.WireIf, c.WireNetns)
	return w, nil
}

// pairs are the ordered pairs of the nodes' underlay addresses.
func (w *Wire) pairs() ([]testbed.AddrPair, error) {
	addrs := make([]netip.Addr, len(w.c.Nodes))
	for i, n := range w.c.Nodes {
		s, err := n.Docker("info", "-f", "{{.Swarm.NodeAddr}}")
		if err != nil {
			return nil, err
		}
		if addrs[i], err = netip.ParseAddr(s); err != nil {
			return nil, fmt.Errorf("%s: swarm node address %q: %w", n, s, err)
		}
	}
	var out []testbed.AddrPair
	for i := range addrs {
		for j := range addrs {
			if i != j {
				out = append(out, testbed.AddrPair{Src: addrs[i], Dst: addrs[j]})
			}
		}
	}
	return out, nil
}

// verify stops the capture and judges what it saw between every two
// nodes; without a capture there is nothing to judge.
func (w *Wire) verify(judge func(testbed.CaptureStats, []testbed.AddrPair) []error) error {
	if w.cap == nil {
		return nil
	}
	st, err := w.cap.Stop()
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	w.c.T.Logf("capture: %d IPv4 packets, ESP %v, plaintext VXLAN by VNI %v", st.Total, st.ESP, st.VXLAN)
	pairs, err := w.pairs()
	if err != nil {
		return err
	}
	return errors.Join(judge(st, pairs)...)
}

// VerifyClear stops the capture and requires VXLAN of vni in clear both
// ways between every two nodes: on an unencrypted network, the capture's
// proof that it sees the underlay at all.
func (w *Wire) VerifyClear(vni uint32) error {
	return w.verify(func(st testbed.CaptureStats, pairs []testbed.AddrPair) (errs []error) {
		for _, p := range pairs {
			if st.VXLANFlows[testbed.VXLANFlow{AddrPair: p, VNI: vni}] == 0 {
				errs = append(errs, fmt.Errorf("the capture holds no VXLAN of VNI %d from %v: it does not see the underlay", vni, p))
			}
		}
		if len(errs) == 0 {
			w.c.T.Logf("on the wire: the unencrypted network's VXLAN (VNI %d) in clear both ways between every two nodes", vni)
		}
		return errs
	})
}

// VerifyESP stops the capture and requires ESP both ways between every two
// nodes and not one VXLAN packet of vni in clear.
func (w *Wire) VerifyESP(vni uint32) error {
	return w.verify(func(st testbed.CaptureStats, pairs []testbed.AddrPair) (errs []error) {
		for _, p := range pairs {
			if st.ESP[p] == 0 {
				errs = append(errs, fmt.Errorf("the capture holds no ESP from %v", p))
			}
		}
		if n := st.VXLAN[vni]; n > 0 {
			errs = append(errs, fmt.Errorf("%d VXLAN packets of VNI %d in clear on the wire", n, vni))
		}
		if len(errs) == 0 {
			w.c.T.Logf("on the wire: ESP both ways between every two nodes; no VXLAN of VNI %d in clear", vni)
		}
		return errs
	})
}
