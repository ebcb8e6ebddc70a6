package demo

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

const (
	// firstPing bounds the first answer of a path: the first packets may
	// wait for the containers' neighbour resolution (answered locally by
	// the sandbox's ARP/NDP proxy).
	firstPing = 5 * time.Second
	// thenPings must all be answered once the path works.
	thenPings = 3
)

// pingAll pings every container from every other, over IPv4 and IPv6.
func (r *run) pingAll(ctx context.Context) error {
	r.out.step("Pinging every container from every other, across hosts (IPv4 and IPv6)")
	for _, a := range r.ctrs {
		for _, b := range r.ctrs {
			if a == b {
				continue
			}
			for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
				if err := ctx.Err(); err != nil {
					return err
				}
				dst, _ := b.Addr(fam)
				what := fmt.Sprintf("%s (%s) -> %s (%s)  %s", a.Name, a.Host.Name, b.Name, b.Host.Name, dst)
				if err := ping(a, dst); err != nil {
					r.res.Failed++
					r.res.FailedPings = append(r.res.FailedPings, fmt.Sprintf("%s->%s %s", a.Name, b.Name, dst))
					r.out.say("%s  %s: %v", r.out.paint(red, "FAIL"), what, err)
					continue
				}
				r.res.Passed++
				r.out.say("%s    %s", r.out.paint(green, "ok"), what)
			}
		}
	}
	return nil
}

// ping waits for a first answer, then wants each of thenPings answered.
func ping(from *testbed.Container, dst netip.Addr) error {
	if err := from.PingUntil(dst, firstPing); err != nil {
		return err
	}
	for range thenPings {
		if err := from.Ping(dst, testbed.PingTimeout); err != nil {
			return err
		}
	}
	return nil
}
