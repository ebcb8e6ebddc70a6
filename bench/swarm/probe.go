package swarm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// connectLoop starts a new non-blocking TCP connection to dst every
// `every` until one is established, and returns when that was and how many
// were started. A connection not established within a second is given up
// (its SYN was lost while the path was not there yet; the kernel would
// retry it only after a second): the loop's resolution is `every`, not the
// kernel's retransmission timer. Refused connections count as not yet: the
// listener is part of "reachable". It runs on the calling thread, whose
// namespace the sockets get.
func connectLoop(dst netip.AddrPort, every, limit time.Duration) (time.Time, int, error) {
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	type pending struct {
		fd int
		at time.Time
	}
	var ps []pending
	defer func() {
		for _, p := range ps {
			unix.Close(p.fd)
		}
	}()
	start := time.Now()
	end, next := start.Add(limit), start
	attempts := 0
	var last error
	for {
		now := time.Now()
		if now.After(end) {
			return time.Time{}, attempts, fmt.Errorf("no connection to %s within %v (%d attempts; last error: %v)", dst, limit, attempts, last)
		}
		if !now.Before(next) {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return time.Time{}, attempts, err
			}
			attempts++
			switch err := unix.Connect(fd, sa); {
			case err == nil:
				unix.Close(fd)
				return time.Now(), attempts, nil
			case errors.Is(err, unix.EINPROGRESS):
				ps = append(ps, pending{fd, now})
			default: // no route yet, for one
				last = err
				unix.Close(fd)
			}
			next = now.Add(every)
		}
		// Give up the attempts older than a second.
		keep := ps[:0]
		for _, p := range ps {
			if now.Sub(p.at) > time.Second {
				unix.Close(p.fd)
				continue
			}
			keep = append(keep, p)
		}
		ps = keep
		pfds := make([]unix.PollFd, len(ps))
		for i, p := range ps {
			pfds[i] = unix.PollFd{Fd: int32(p.fd), Events: unix.POLLOUT}
		}
		wait := max(time.Until(next), time.Millisecond)
		if _, err := unix.Poll(pfds, int(wait.Milliseconds())); err != nil && !errors.Is(err, unix.EINTR) {
			return time.Time{}, attempts, err
		}
		at := time.Now()
		keep = ps[:0]
		for i, p := range ps {
			if pfds[i].Revents == 0 {
				keep = append(keep, p)
				continue
			}
			soerr, err := unix.GetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil && soerr == 0 && pfds[i].Revents&unix.POLLOUT != 0 {
				unix.Close(p.fd)
				ps = append(keep, ps[i+1:]...) // the rest: closed by the defer
				return at, attempts, nil
			}
			last = unix.Errno(soerr)
			unix.Close(p.fd)
		}
		ps = keep
	}
}

// probe is a connectLoop running in a namespace: started before the clock,
// so that entering the namespace is not timed.
type probe struct {
	started chan struct{}
	done    chan probeResult
}

type probeResult struct {
	at       time.Time
	attempts int
	err      error
}

// startProbe starts connecting to dst from the namespace at ns; it returns
// once the prober is in the namespace.
func startProbe(ns string, dst netip.AddrPort, every, limit time.Duration) (*probe, error) {
	p := &probe{started: make(chan struct{}), done: make(chan probeResult, 1)}
	errc := make(chan error, 1)
	go func() {
		errc <- inNetNS(ns, func() error {
			close(p.started)
			at, n, err := connectLoop(dst, every, limit)
			p.done <- probeResult{at, n, err}
			return nil
		})
	}()
	select {
	case <-p.started:
		return p, nil
	case err := <-errc:
		return nil, err
	}
}

// httpGet fetches / from dst with a connection made in the namespace at ns
// and returns the body: the check that the right container answered.
func httpGet(ns string, dst netip.AddrPort) (string, error) {
	var c net.Conn
	if err := inNetNS(ns, func() (err error) {
		c, err = net.DialTimeout("tcp4", dst.String(), 10*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", dst.Addr()); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET http://%s/: %s", dst, resp.Status)
	}
	return strings.TrimSpace(string(b)), nil
}
