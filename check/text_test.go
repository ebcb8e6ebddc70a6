package check

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/health"
)

// The text is what operators read and scripts (the Docker e2e) match.
func TestWriteText(t *testing.T) {
	peer := netip.MustParseAddr("198.51.100.2")
	var b bytes.Buffer
	Report{Findings: []Finding{{Area: "data path", Subject: "198.51.100.2", Problem: "VXLAN to 198.51.100.2 on UDP 4789 gets no answer"}},
		Probing: true, Paths: []health.PathStatus{{Peer: peer, Path: health.PathVXLAN, State: health.StateDown, MTU: 1450}}}.WriteText(&b)
	for _, want := range []string{"PROBLEM data path 198.51.100.2: VXLAN to 198.51.100.2 on UDP 4789", "PEER", "198.51.100.2  vxlan  down", "1 problem(s)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	Report{OK: true, Probing: true, Paths: []health.PathStatus{{Peer: peer, Path: health.PathVXLAN, State: health.StateUp, MTU: 1450, PathMTU: 1450}}}.WriteText(&b)
	if !strings.Contains(b.String(), "OK: 1 data paths probed, nothing wrong") {
		t.Errorf("a clean report:\n%s", b.String())
	}
}
