package dockere2e

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// rotationLeadMax is the plugin's longest lead before a new key generation
// is used: min(1 min, key rotation interval / 10).
const rotationLeadMax = 60 * time.Second

var (
	rePingTotals = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)
	rePingSeq    = regexp.MustCompile(`seq=(\d+) `)
)

// RotationUnderStream: each endpoint pings the next node's, 5 numbered
// echo requests a second (a sequenced stream), while node 0's plugin is
// told `overlay-plugin rotate-keys`. The new generation must activate
// within the stream (every node's outbound SPI changes) and no stream may
// lose a packet.
func (c *Check) RotationUnderStream(eps []Endpoint) error {
	// 5 s of stream before the rotation, the longest lead, 20 s after it.
	const perSecond = 5
	count := (5 + int(rotationLeadMax/time.Second) + 20) * perSecond
	streamLen := time.Duration(count/perSecond) * time.Second
	before := make([]string, len(eps))
	for i, ep := range eps {
		var err error
		if before[i], err = c.policySPIs(ep.Node); err != nil {
			return fmt.Errorf("%s: overlay-plugin encryption: no remote SPI: %w", ep.Node, err)
		}
	}
	t0 := time.Now()
	outs := c.startPings(eps, count, c.Scaled(streamLen+time.Minute))
	time.Sleep(5 * time.Second)
	node0 := eps[0].Node
	if out, err := c.PluginCLI(node0, "rotate-keys"); err != nil {
		return fmt.Errorf("%s: overlay-plugin rotate-keys: %w %s", node0, err, out)
	}
	st, err := c.Encryption(node0)
	if err != nil || len(st.Own) == 0 {
		return fmt.Errorf("%s: no new key generation after rotate-keys (%v)", node0, err)
	}
	newest := slices.MaxFunc(st.Own, func(a, b encryption.PublicKeyInfo) int { return cmp.Compare(a.Gen, b.Gen) })
	lead := time.Until(newest.ActivateAt)
	c.T.Logf("%s: rotate-keys at stream second %.0f; the new generation activates in %v (%v)", node0, time.Since(t0).Seconds(), lead.Round(time.Second), newest.ActivateAt)
	if lead > rotationLeadMax {
		return fmt.Errorf("the new generation activates after more than %v: the stream ends before it", rotationLeadMax)
	}
	// Every sender switches to the new generation's SAs while the streams run.
	after := make([]string, len(eps))
	for {
		changed := true
		for i, ep := range eps {
			if after[i], err = c.policySPIs(ep.Node); err != nil || after[i] == before[i] {
				changed = false
			}
		}
		if changed {
			break
		}
		if time.Since(t0) > streamLen {
			return fmt.Errorf("the outbound SPIs did not change within the stream: before %q, now %q", before, after)
		}
		time.Sleep(2 * time.Second)
	}
	c.T.Logf("at stream second %.0f every node sends with the new generation: SPIs %q -> %q", time.Since(t0).Seconds(), before, after)
	return errors.Join(c.tallyPings(eps, outs, count, "the rotation")...)
}

// startPings has each endpoint ping the next one's address, count
// numbered echo requests 5 a second; each channel gets ping's output.
func (c *Check) startPings(eps []Endpoint, count int, limit time.Duration) []chan string {
	outs := make([]chan string, len(eps))
	for i, ep := range eps {
		to := eps[(i+1)%len(eps)]
		outs[i] = make(chan string, 1)
		go func() {
			out, _ := ep.Node.DockerT(limit, "exec", ep.CID, "ping", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "10", to.IP)
			outs[i] <- out
		}()
	}
	return outs
}

// tallyPings waits for startPings' streams and returns an error for each
// that lost an echo request across what.
func (c *Check) tallyPings(eps []Endpoint, outs []chan string, count int, what string) []error {
	var errs []error
	for i, ep := range eps {
		to := eps[(i+1)%len(eps)]
		out := <-outs[i]
		m := rePingTotals.FindStringSubmatch(out)
		if m != nil && m[1] == strconv.Itoa(count) && m[2] == m[1] {
			c.T.Logf("%s -> %s: %s of %s numbered echo requests answered across %s", ep.Node, to.IP, m[2], m[1], what)
			continue
		}
		seen := map[string]bool{}
		for _, s := range rePingSeq.FindAllStringSubmatch(out, -1) {
			seen[s[1]] = true
		}
		var missing []string
		for s := range count {
			if !seen[strconv.Itoa(s)] {
				missing = append(missing, strconv.Itoa(s))
			}
		}
		errs = append(errs, fmt.Errorf("%s -> %s: %v across %s; unanswered seq (0.2 s apart): %.300s",
			ep.Node, to.IP, m, what, strings.Join(missing, " ")))
	}
	return errs
}
