package gossip

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// consistentWithin bounds how long after a restart every host's kernel may
// differ from the peer tables (issue 12).
const consistentWithin = 2 * time.Second

// TestRestartDuringChurn kills one plugin (SIGKILL, then in a second
// cluster SIGTERM) while the other hosts churn endpoints, and makes
// endpoints leave while it is down; after its restart every host's peer
// table and kernel (as the plugin reads it, and as ip and bridge read it)
// must be consistent within two seconds: the restarted one's stale
// entries go, none of the live ones is lost.
func TestRestartDuringChurn(t *testing.T) {
	requireTestbed(t)
	for _, kill := range []bool{true, false} {
		name := "SIGTERM"
		if kill {
			name = "SIGKILL"
		}
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, options{})
			c.containerPerHost()
			victim, others := c.nodes[1], []*gnode{c.nodes[0], c.nodes[2]}
			// Endpoints that will leave while the victim is down.
			var leaving []*endpoint
			for _, n := range others {
				for range 3 {
					ep, err := c.createJoin(n, slotAddrs(c.newSlot()), "/var/run/docker/netns/"+testbed.RandomHex(12))
					if err != nil {
						t.Fatal(err)
					}
					c.mu.Lock()
					c.live[ep.id] = ep
					c.mu.Unlock()
					leaving = append(leaving, ep)
				}
			}
			c.waitConverged(converge, "before the restart")
			if err := victim.plugin.HoldSandboxes(); err != nil {
				t.Fatal(err)
			}

			stop := make(chan struct{})
			errc := make(chan error, len(others))
			var wg sync.WaitGroup
			for _, n := range others {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						ep, err := c.createJoin(n, slotAddrs(c.newSlot()), "/var/run/docker/netns/"+testbed.RandomHex(12))
						if err != nil {
							errc <- err
							return
						}
						c.mu.Lock()
						c.live[ep.id] = ep
						c.mu.Unlock()
						time.Sleep(30 * time.Millisecond)
						if err := c.leaveErr(ep); err != nil {
							errc <- err
							return
						}
					}
				})
			}
			time.Sleep(300 * time.Millisecond) // churn under way
			var err error
			if kill {
				err = victim.plugin.Kill()
			} else {
				err = victim.plugin.Stop(0)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, ep := range leaving {
				if err := c.leaveErr(ep); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(300 * time.Millisecond)
			close(stop)
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}

			args := []string{"--gossip-port", strconv.Itoa(gossipPort), "--node-name", victim.name,
				"--join", c.nodes[0].host.Underlay.String()}
			p, err := victim.host.StartPlugin(testbed.PluginConfig{Args: args})
			if err != nil {
				t.Fatalf("restart %s: %v", victim.name, err)
			}
			victim.plugin = p
			restarted := time.Now()
			c.enable(victim)
			var last []string
			for {
				if last = c.diffs(true); len(last) == 0 {
					break
				}
				if time.Since(restarted) > consistentWithin {
					c.fatalf("%s after a %s restart: not consistent within %v:\n  %s", victim.name, name, consistentWithin, strings.Join(last, "\n  "))
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("%s restart: every host consistent %v after the plugin was ready", name, time.Since(restarted).Round(time.Millisecond))
			c.checkTraffic(c.liveWithContainers(), false)
		})
	}
}

// liveWithContainers returns the live endpoints that have a container.
func (c *gcluster) liveWithContainers() []*endpoint {
	var out []*endpoint
	for _, ep := range c.liveEndpoints() {
		if ep.ctr != nil {
			out = append(out, ep)
		}
	}
	return out
}
