package vip

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
	"github.com/overlay-plugin/overlay-plugin/servicelb"
)

// minDials and maxDials bound the connections that check one VIP: at
// least minDials, so that a task that should be gone but is still in the
// table (one in four picks) is met with probability 1-(3/4)^15 > 98%, and
// until every live task answered, at most maxDials ((2/3)^60: never, in
// practice, for a live task missed).
const (
	minDials = 15
	maxDials = 60
)

// balances checks, by connections from inside the client, that s's VIP
// reaches exactly s's tasks: no other address answers, and every task
// does.
func balances(c client, s servicelb.Service) error {
	return nsthread.Do(c.ns, func() error {
		seen := map[netip.Addr]bool{}
		for i := 0; i < maxDials && (i < minDials || len(seen) < len(s.Backends)); i++ {
			got, err := ask(netip.AddrPortFrom(s.VIP, port))
			if err != nil {
				return fmt.Errorf("%s: connection %d to %s: %w", c.path, i, s.VIP, err)
			}
			if !slices.Contains(s.Backends, got) {
				return fmt.Errorf("%s: %s reached %s, not one of its tasks %v", c.path, s.VIP, got, s.Backends)
			}
			seen[got] = true
		}
		if len(seen) != len(s.Backends) {
			return fmt.Errorf("%s: %s reached %d of its %d tasks in %d connections", c.path, s.VIP, len(seen), len(s.Backends), maxDials)
		}
		return nil
	})
}

// checkAll runs check for every client at once and returns the first
// error.
func checkAll(clients []client, check func(i int, c client) error) error {
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { errs[i] = check(i, c) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
