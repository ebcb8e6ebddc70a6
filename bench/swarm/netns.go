package swarm

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetNS runs f on an OS thread of its own that has entered the network
// namespace at path (a /run/netns/NAME or /proc/PID/ns/net). The thread is
// never handed back to Go's scheduler: the goroutine exits locked, so the
// runtime ends the thread. A socket f creates belongs to that namespace
// for its whole life, whichever thread reads or writes it later; nothing
// else of this process changes namespace.
func inNetNS(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open %s: %w", path, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// listenIn listens on addr in the namespace at ns.
func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNetNS(ns, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	return ln, err
}

// mtuIn is the MTU of interface name in the namespace at ns (0 if unknown).
func mtuIn(ns, name string) int {
	mtu := 0
	inNetNS(ns, func() error {
		if ifi, err := net.InterfaceByName(name); err == nil {
			mtu = ifi.MTU
		}
		return nil
	})
	return mtu
}

// fastNeighbourRetry sets, in the namespace at ns, every interface's ARP
// retry interval to ms milliseconds. The prober's namespace only: it asks
// for an address before the container that has it exists, and with the
// kernel's 1 s retry every figure would be rounded up to the next second
// of that timer rather than show when the path was ready. /proc/sys/net is
// the reading thread's namespace's.
func fastNeighbourRetry(ns string, ms int) error {
	return inNetNS(ns, func() error {
		dirs, err := filepath.Glob("/proc/sys/net/ipv4/neigh/*")
		if err != nil {
			return err
		}
		for _, d := range dirs {
			switch filepath.Base(d) {
			case "default", "lo":
				continue
			}
			if err := os.WriteFile(filepath.Join(d, "retrans_time_ms"), []byte(fmt.Sprint(ms)), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// rxBytes is the received-bytes counter of interface name in the namespace
// at ns.
func rxBytes(ns, name string) (uint64, error) {
	h, err := netns.GetFromPath(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return 0, err
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return 0, err
	}
	if l.Attrs().Statistics == nil {
		return 0, fmt.Errorf("%s in %s: no statistics", name, ns)
	}
	return l.Attrs().Statistics.RxBytes, nil
}
