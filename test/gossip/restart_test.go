package gossip

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
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
			victim, others := c.Nodes[1], []*testbed.Node{c.Nodes[0], c.Nodes[2]}
			// Endpoints that will leave while the victim is down.
			var leaving []*testbed.Endpoint
			for _, n := range others {
				for range 3 {
					ep, err := c.joinNoContainer(n, c.newSlot())
					if err != nil {
						t.Fatal(err)
					}
					leaving = append(leaving, ep)
				}
			}
			c.waitConverged(converge, "before the restart")
			if err := victim.Plugin.HoldSandboxes(); err != nil {
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
						ep, err := c.joinNoContainer(n, c.newSlot())
						if err != nil {
							errc <- err
							return
						}
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
				err = victim.Plugin.Kill()
			} else {
				err = victim.Plugin.Stop(0)
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

			// Started as before: gossip on, joining h1.
			if err := c.Restart(victim); err != nil {
				t.Fatalf("restart %s: %v", victim.Name, err)
			}
			restarted := time.Now()
			if err := c.Enable(victim); err != nil {
				t.Fatal(err)
			}
			err = wait.Until(consistentWithin-time.Since(restarted), 50*time.Millisecond, func() error {
				if d := c.diffs(true); len(d) > 0 {
					return errors.New(strings.Join(d, "\n  "))
				}
				return nil
			})
			if err != nil {
				c.fatalf("%s after a %s restart: not consistent: %v", victim.Name, name, err)
			}
			t.Logf("%s restart: every host consistent %v after the plugin was ready", name, time.Since(restarted).Round(time.Millisecond))
			c.checkTraffic(c.liveWithContainers(), false)
		})
	}
}
