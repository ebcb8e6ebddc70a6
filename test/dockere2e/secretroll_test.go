package dockere2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// secretsView is the part of `overlay-plugin cluster` the roll reads.
type secretsView struct {
	Secrets encryption.SecretsStatus `json:"secrets"`
}

var (
	reReloaded = regexp.MustCompile(`secret file read`)
	reSPI      = regexp.MustCompile(`spi (0x[0-9a-f]+)`)
)

// secretFile is the cluster secret file of n's plugin, as its host sees it
// (the 'secrets' mount's source).
func (c *Check) secretFile(n *Node) (string, error) {
	src, err := c.mountSource(n, "secrets")
	return src + "/secret", err
}

// readmeRoll are the README's commands of the three steps (Rotating the
// cluster secret) but for `overlay-plugin reload`, which follows each:
// TestReadmeRollCommands keeps them the README's.
var readmeRoll = [3]string{
	"cat new-secret >> /etc/overlay-plugin/secret",
	"cd /etc/overlay-plugin\n(umask 077; { sed -n 2p secret; sed -n 1p secret; } > secret.new) && mv secret.new secret",
	"sed -i 2d /etc/overlay-plugin/secret",
}

// rollStep runs step i of the README's roll on n, in the directory of its
// secret file, with new-secret in dir, then `overlay-plugin reload`.
func (c *Check) rollStep(n *Node, i int, dir string) error {
	path, err := c.secretFile(n)
	if err != nil {
		return err
	}
	script := "cd " + dir + "\n" + strings.ReplaceAll(readmeRoll[i], "/etc/overlay-plugin", filepath.Dir(path))
	if out, err := n.Host("sh", "-ec", script); err != nil {
		return fmt.Errorf("%s: step %d of the README's roll: %w %s", n, i+1, err, out)
	}
	out, err := c.PluginCLI(n, "reload")
	if err != nil || !reReloaded.MatchString(out) {
		return fmt.Errorf("%s: overlay-plugin reload: %v %s", n, err, out)
	}
	return nil
}

func (c *Check) secrets(n *Node) (secretsView, error) {
	var v secretsView
	out, err := c.PluginCLI(n, "cluster")
	if err == nil {
		err = json.Unmarshal([]byte(out), &v)
	}
	return v, err
}

// SecretRollUnderStream rolls the cluster secret in the README's three
// steps on every node while each endpoint pings the next node's, 5
// numbered echo requests a second, and endpoint 0 streams numbered lines
// to endpoint 1 over one TCP connection (busybox nc). No echo request may
// go unanswered, every line must arrive, and at the end every pair's IPsec
// is keyed with the new secret (`overlay-plugin cluster`) on SAs that
// `ip xfrm state` did not hold before.
func (c *Check) SecretRollUnderStream(eps []Endpoint) error {
	const perSecond, port = 5, 7100
	streamLen := c.Scaled(90 * time.Second)
	count := int(streamLen/time.Second) * perSecond
	oldOut, err := c.PluginCLI(c.Nodes[0], "cluster")
	if err != nil {
		return err
	}
	var v0 secretsView
	if err := json.Unmarshal([]byte(oldOut), &v0); err != nil || len(v0.Secrets.Held) != 1 {
		return fmt.Errorf("%s: overlay-plugin cluster: no single secret held before the roll (%v): %.300s", c.Nodes[0], err, oldOut)
	}
	oldID := v0.Secrets.Held[0]
	// The README's "once, then copy to every node": one file beside the
	// nodes' secret directories, which every node's host sees.
	path0, err := c.secretFile(c.Nodes[0])
	if err != nil {
		return err
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(path0)), "roll")
	if out, err := c.Nodes[0].Host("sh", "-ec", "mkdir -p "+dir+"\ncd "+dir+"\nhead -c32 /dev/urandom | base64 > new-secret"); err != nil {
		return fmt.Errorf("make the new secret: %w %s", err, out)
	}
	defer c.Nodes[0].Host("rm", "-rf", dir)
	spisBefore := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		if spisBefore[i], err = c.kernelSPIs(n); err != nil {
			return err
		}
	}

	// The streams: pings, and a TCP connection carrying a line every 0.2 s.
	from, to := eps[0], eps[1%len(eps)]
	// The listener's stdin stays open: busybox nc ends the connection
	// when its stdin ends, and docker exec -d gives it none.
	if _, err := to.Node.Docker("exec", "-d", to.CID, "sh", "-c", fmt.Sprintf("tail -f /dev/null | nc -l -p %d >/tmp/roll.got", port)); err != nil {
		return fmt.Errorf("%s: nc listener: %w", to.Node, err)
	}
	time.Sleep(time.Second)
	tcpDone := make(chan string, 1)
	go func() {
		out, err := from.Node.DockerT(streamLen+time.Minute, "exec", from.CID, "sh", "-c",
			fmt.Sprintf(`end=$(($(date +%%s) + %d)); i=0
				(while [ "$(date +%%s)" -lt $end ]; do echo "line $i"; i=$((i + 1)); sleep 0.2; done; echo $i >/tmp/roll.sent) | nc %s %d`,
				int(streamLen/time.Second), to.IP, port))
		if err != nil {
			out = fmt.Sprintf("%v %s", err, out)
		}
		tcpDone <- out
	}()
	t0 := time.Now()
	outs := c.startPings(eps, count, streamLen+time.Minute)
	time.Sleep(5 * time.Second)

	newID := ""
	step := func(name string, i int, ok func(held []string, pair string) bool) error {
		start := time.Now()
		for _, n := range c.Nodes {
			if err := c.rollStep(n, i, dir); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		if newID == "" {
			v, err := c.secrets(c.Nodes[0])
			if err != nil || len(v.Secrets.Held) != 2 {
				return fmt.Errorf("%s: %s holds %v (%v)", name, c.Nodes[0], v.Secrets.Held, err)
			}
			newID = v.Secrets.Held[1]
		}
		err := c.Retry(60*time.Second, func() error {
			for _, n := range c.Nodes {
				v, err := c.secrets(n)
				if err != nil {
					return err
				}
				if len(v.Secrets.Members) != len(c.Nodes)-1 {
					return fmt.Errorf("%s lists %d members", n, len(v.Secrets.Members))
				}
				for _, m := range v.Secrets.Members {
					if !ok(m.Secrets, m.PairSecret) {
						return fmt.Errorf("%s sees %s hold %v, pair secret %q", n, m.Name, m.Secrets, m.PairSecret)
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		c.T.Logf("%s: on every node, and seen by every node, %v after the step began (stream second %.0f)", name, time.Since(start).Round(time.Second), time.Since(t0).Seconds())
		return nil
	}
	var errs []error
	if err := step("step 1, the new secret second", 0, func(held []string, pair string) bool {
		return slices.Equal(held, []string{oldID, newID}) && pair == oldID
	}); err != nil {
		errs = append(errs, err)
	} else if err := step("step 2, the new secret first", 1, func(held []string, pair string) bool {
		return slices.Equal(held, []string{newID, oldID}) && pair == newID
	}); err != nil {
		errs = append(errs, err)
	} else if err := step("step 3, the old secret removed", 2, func(held []string, pair string) bool {
		return slices.Equal(held, []string{newID}) && pair == newID
	}); err != nil {
		errs = append(errs, err)
	}
	if time.Since(t0) > streamLen-10*time.Second {
		errs = append(errs, fmt.Errorf("the roll took %v, longer than the streams that check it", time.Since(t0).Round(time.Second)))
	}
	c.T.Logf("roll from secret %s to %s done at stream second %.0f", oldID, newID, time.Since(t0).Seconds())
	for i, n := range c.Nodes {
		after, err := c.kernelSPIs(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.T.Logf("%s: ip xfrm state SPIs %s -> %s", n, spisBefore[i], after)
		for _, spi := range strings.Fields(after) {
			if slices.Contains(strings.Fields(spisBefore[i]), spi) {
				errs = append(errs, fmt.Errorf("%s: SPI %s of the old secret still installed after the roll", n, spi))
			}
		}
	}

	errs = append(errs, c.tallyPings(eps, outs, count, "the roll")...)
	if out := <-tcpDone; strings.TrimSpace(out) != "" {
		errs = append(errs, fmt.Errorf("TCP stream %s -> %s: %s", from.Node, to.IP, out))
	}
	// What the listener wrote, once it has all: in order, none missing.
	sentOut, err := from.Node.Exec(from.CID, "cat", "/tmp/roll.sent")
	sent, _ := strconv.Atoi(strings.TrimSpace(sentOut))
	if err != nil || sent == 0 {
		errs = append(errs, fmt.Errorf("TCP stream %s -> %s: the sender's count: %q %v", from.Node, to.IP, sentOut, err))
	}
	err = c.Retry(10*time.Second, func() error {
		got, err := to.Node.Exec(to.CID, "cat", "/tmp/roll.got")
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(got), "\n")
		for i := range sent {
			if i >= len(lines) || lines[i] != "line "+strconv.Itoa(i) {
				return fmt.Errorf("TCP stream %s -> %s: %d lines arrived, the first %d in order, of %d", from.Node, to.IP, len(lines), i, sent)
			}
		}
		if len(lines) != sent {
			return fmt.Errorf("TCP stream %s -> %s: %d lines arrived, %d sent", from.Node, to.IP, len(lines), sent)
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	} else {
		c.T.Logf("TCP stream %s -> %s: all %d lines arrived, in order, over one connection", from.Node, to.IP, sent)
	}
	return errors.Join(errs...)
}

// kernelSPIs are the SPIs of the ESP states `ip xfrm state` shows on n's
// host, sorted.
func (c *Check) kernelSPIs(n *Node) (string, error) {
	out, err := n.Host("ip", "xfrm", "state", "list")
	if err != nil {
		return "", err
	}
	var spis []string
	for _, f := range reSPI.FindAllStringSubmatch(out, -1) {
		spis = append(spis, f[1])
	}
	slices.Sort(spis)
	return strings.Join(spis, " "), nil
}
