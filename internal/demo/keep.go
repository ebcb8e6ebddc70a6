package demo

import (
	"bufio"
	"context"
	"fmt"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// keep prints commands to look around with and waits for Enter (or EOF),
// or for the context's end.
func (r *run) keep(ctx context.Context) error {
	h1, h2, h3 := r.plugins[0], r.plugins[1], r.plugins[2]
	c1, c2, c3 := r.ctrs[0], r.ctrs[1], r.ctrs[2]
	r.out.step("Leaving everything up (--keep). Try, in another shell:")
	c2v4, _ := c2.Addr(testbed.IPv4)
	c1v6, _ := c1.Addr(testbed.IPv6)
	r.out.say("ip netns exec %s ping %s", c1.Netns.Name, c2v4)
	r.out.say("ip netns exec %s ping %s", c3.Netns.Name, c1v6)
	r.out.say("%s cluster --admin-socket %s", r.bin, h1.AdminSocket)
	r.out.say("%s state --admin-socket %s", r.bin, h2.AdminSocket)
	r.out.say("curl -s --unix-socket %s http://admin/v1/cluster", h3.AdminSocket)
	if _, sandbox, err := r.remotePeers(h1); err == nil && sandbox != "" {
		r.out.say("nsenter --net=%s bridge fdb show dev vxlan0", h1.SandboxPath(sandbox))
	}
	r.out.say("tail -f %s", h2.LogFile)
	r.out.say("kill -KILL %d   # crash h3: after the dead grace (30 s) h1 and h2 drop its endpoint", h3.Pid())
	fmt.Fprintf(r.out.w, "\n    %s ", r.out.paint(bold, "Press Enter to clean up."))

	line := make(chan struct{})
	go func() {
		// Left blocked on a terminal if ctx ends first; the process exits soon.
		_, _ = bufio.NewReader(r.cfg.Stdin).ReadString('\n')
		close(line)
	}()
	select {
	case <-line:
		fmt.Fprintln(r.out.w)
		return nil
	case <-ctx.Done():
		fmt.Fprintln(r.out.w)
		return ctx.Err()
	}
}
