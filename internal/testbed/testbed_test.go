package testbed

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("TESTBED_FAKE_PLUGIN"); mode != "" {
		os.Exit(fakePlugin(mode))
	}
	_ = SweepStale()
	code := m.Run()
	if err := Sweep(); err != nil {
		os.Stderr.WriteString("testbed sweep: " + err.Error() + "\n")
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func requireTestbed(t *testing.T) {
	t.Helper()
	if err := Check(); err != nil {
		t.Skipf("SKIP: testbed unavailable on this machine: %v", err)
	}
}

func ourNamespaces(t *testing.T) []string {
	t.Helper()
	out, err := Namespaces()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTopology checks the testbed itself, without a plugin: underlay
// reachability in both families, partitions by link state, ICMP and TCP
// probes, a Docker-style attach and detach, and complete cleanup.
func TestTopology(t *testing.T) {
	requireTestbed(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			b := New(nil) // cleaned up by hand below, to check the result
			defer b.Cleanup()
			topo, err := b.NewTopology(fam, 3)
			if err != nil {
				t.Fatal(err)
			}
			if err := topo.WaitUnderlay(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			h1, h2, h3 := topo.Hosts[0], topo.Hosts[1], topo.Hosts[2]
			if !UnderlayIPv4.Contains(h1.Underlay) && !UnderlayIPv6.Contains(h1.Underlay) {
				t.Fatalf("h1 underlay %v outside the test ranges", h1.Underlay)
			}

			// A non-existent address in the underlay gets no answer: the
			// probe can fail.
			ghost := nthAddr(h1.Prefix, 200)
			if err := h1.NS.PingFails(ghost, 1); err != nil {
				t.Fatal(err)
			}

			// Partition h3, then heal it.
			if err := h3.SetLink(false); err != nil {
				t.Fatal(err)
			}
			if err := h1.NS.PingFails(h3.Underlay, 2); err != nil {
				t.Fatal(err)
			}
			if err := h1.NS.Ping(h2.Underlay, 2*time.Second); err != nil {
				t.Fatalf("h2 must stay reachable while h3 is cut: %v", err)
			}
			if err := h3.SetLink(true); err != nil {
				t.Fatal(err)
			}
			if err := h1.NS.PingUntil(h3.Underlay, 10*time.Second); err != nil {
				t.Fatal(err)
			}

			// TCP over the underlay, bigger than any MTU.
			echo, err := h2.NS.StartEcho(netip.AddrPortFrom(h2.Underlay, 0))
			if err != nil {
				t.Fatal(err)
			}
			if err := h1.NS.TCPExchange(echo.Addr, 1<<20, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := echo.Close(); err != nil {
				t.Fatal(err)
			}

			// Docker-style attach of a veth the "plugin" left in h1, with
			// the peer end in h2's container: a direct cable.
			c1, err := h1.NewContainer("c1")
			if err != nil {
				t.Fatal(err)
			}
			c2, err := h1.NewContainer("c2")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h1.NS.IP("link", "add", "vhA", "type", "veth", "peer", "name", "vhB"); err != nil {
				t.Fatal(err)
			}
			a1 := []netip.Prefix{netip.MustParsePrefix("203.0.113.1/24"), netip.MustParsePrefix("2001:db8:1::1/64")}
			a2 := []netip.Prefix{netip.MustParsePrefix("203.0.113.2/24"), netip.MustParsePrefix("2001:db8:1::2/64")}
			join := func(src string) *api.JoinResponse {
				return &api.JoinResponse{InterfaceName: api.InterfaceName{SrcName: src, DstPrefix: "eth"},
					StaticRoutes: []*api.StaticRoute{{Destination: "203.0.114.0/24", RouteType: 1}}}
			}
			if err := c1.Attach(join("vhA"), "02:00:00:00:00:01", a1...); err != nil {
				t.Fatal(err)
			}
			if err := c2.Attach(join("vhB"), "02:00:00:00:00:02", a2...); err != nil {
				t.Fatal(err)
			}
			links, err := c1.Links()
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(links, func(l Link) bool { return l.Name == "eth0" })
			if i < 0 || links[i].Address != "02:00:00:00:00:01" || links[i].Kind() != "veth" {
				t.Fatalf("c1 links %+v: want eth0 veth with the given MAC", links)
			}
			if out, err := c1.IP("route", "show", "203.0.114.0/24"); err != nil || !strings.Contains(out, "eth0") {
				t.Fatalf("static route missing in c1: %q %v", out, err)
			}
			for _, f := range []Family{IPv4, IPv6} {
				dst, _ := c2.Addr(f)
				if err := c1.PingUntil(dst, 5*time.Second); err != nil {
					t.Fatal(err)
				}
				echo, err := c2.StartEcho(netip.AddrPortFrom(dst, 7))
				if err != nil {
					t.Fatal(err)
				}
				if err := c1.TCPExchange(echo.Addr, 256<<10, 10*time.Second); err != nil {
					t.Fatal(err)
				}
				if err := echo.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := c1.Detach(); err != nil {
				t.Fatal(err)
			}
			extra, err := h1.ExtraLinks()
			if err != nil {
				t.Fatal(err)
			}
			if len(extra) != 1 || extra[0].Name != "vhA" {
				t.Fatalf("after detach h1 has %v, want the veth back as vhA", extra)
			}

			if len(ourNamespaces(t)) != 6 {
				t.Fatalf("namespaces %v, want switch, 3 hosts, 2 containers", ourNamespaces(t))
			}
			if err := b.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if err := b.Cleanup(); err != nil {
				t.Fatalf("second Cleanup: %v", err)
			}
			if left := ourNamespaces(t); len(left) != 0 {
				t.Fatalf("namespaces left after Cleanup: %v", left)
			}
			if _, err := os.Stat(b.Dir()); !os.IsNotExist(err) {
				t.Fatalf("scratch dir %s left: %v", b.Dir(), err)
			}
		})
	}
}

func TestRunError(t *testing.T) {
	_, err := Run("sh", "-c", "echo boom >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("error %v: want command, status and output", err)
	}
}

// fakePlugin stands in for `overlay-plugin serve` (the test binary re-run
// with TESTBED_FAKE_PLUGIN set): it serves GetCapabilities and /healthz on
// the sockets of its flags and, on SIGTERM, exits 0 ("normal"), exits 1
// ("exit1"), or ignores it ("ignore-term"). "listen-late" is "normal" with
// the Docker socket's file created well before it accepts.
func fakePlugin(mode string) int {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "fake plugin: want serve")
		return 2
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	sock := fs.String("socket", "", "")
	admin := fs.String("admin-socket", "", "")
	fs.String("state-dir", "", "")
	fs.String("sandbox-dir", "", "")
	adv := fs.String("advertise-addr", "", "")
	fs.String("log-level", "", "")
	fs.String("vxlan-port", "", "")
	if err := fs.Parse(os.Args[2:]); err != nil {
		return 2
	}
	sigs := make(chan os.Signal, 1)
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(sigs, syscall.SIGTERM)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/NetworkDriver.GetCapabilities", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.CapabilitiesResponse{Scope: "global", ConnectivityScope: "global"})
	})
	mux.HandleFunc("/NetworkDriver.CreateNetwork", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		json.NewEncoder(w).Encode(api.ErrorResponse{Err: "fake: no networks here"})
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	mux.HandleFunc("/v1/networks", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[]")) })
	for _, path := range []string{*sock, *admin} {
		listen := net.Listen
		if mode == "listen-late" && path == *sock {
			listen = bindThenListen
		}
		l, err := listen("unix", path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake plugin:", err)
			return 1
		}
		go http.Serve(l, mux)
	}
	fmt.Fprintf(os.Stderr, "fake plugin serving, advertise %s\n", *adv)
	<-sigs
	os.Remove(*sock)
	os.Remove(*admin)
	if mode == "exit1" {
		return 1
	}
	return 0
}

// bindThenListen is net.Listen for a unix socket with the gap between
// bind(2), which creates the file, and listen(2) widened to 300ms.
func bindThenListen(_, path string) (net.Listener, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return nil, err
	}
	time.Sleep(300 * time.Millisecond)
	if err := syscall.Listen(fd, 16); err != nil {
		return nil, err
	}
	return net.FileListener(f)
}

// TestPluginLifecycle checks StartPlugin, the clients, Stop and Kill on a
// fake plugin (this test binary).
func TestPluginLifecycle(t *testing.T) {
	requireTestbed(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b := New(t)
	topo, err := b.NewTopology(IPv4, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := topo.Hosts[0]
	start := func(mode string) *Plugin {
		t.Helper()
		p, err := h.StartPlugin(PluginConfig{Bin: self, Env: []string{"TESTBED_FAKE_PLUGIN=" + mode}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	// OnSocket runs once, as soon as the Docker socket accepts, not when
	// its file appears.
	var onSocket int
	p, err := h.StartPlugin(PluginConfig{Bin: self, Env: []string{"TESTBED_FAKE_PLUGIN=listen-late"},
		OnSocket: func(p *Plugin) error {
			onSocket++
			_, err := p.API.Capabilities()
			return err
		}})
	if err != nil || onSocket != 1 {
		t.Fatalf("StartPlugin with OnSocket: %v, called %d times", err, onSocket)
	}
	if err := p.Stop(0); err != nil {
		t.Fatal(err)
	}
	p, err = h.StartPlugin(PluginConfig{Bin: self, Env: []string{"TESTBED_FAKE_PLUGIN=normal"},
		OnSocket: func(*Plugin) error { return fmt.Errorf("boom") }})
	if err == nil || !strings.Contains(err.Error(), "OnSocket: boom") {
		t.Fatalf("StartPlugin with a failing OnSocket: %v", err)
	}
	if err := p.Stop(0); err != nil {
		t.Fatal(err)
	}

	p = start("normal")
	// The process runs in the host's namespace.
	pns, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	hns, err := os.Stat(h.NS.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(pns, hns) {
		t.Fatalf("plugin pid %d is not in %s", p.Pid(), h.NS.Name)
	}
	caps, err := p.API.Capabilities()
	if err != nil || caps.Scope != "global" {
		t.Fatalf("Capabilities = %+v, %v", caps, err)
	}
	err = p.API.CreateNetwork(&api.CreateNetworkRequest{NetworkID: "x"})
	if pe, ok := err.(*PluginError); !ok || pe.Err != "fake: no networks here" || pe.Status != 500 {
		t.Fatalf("CreateNetwork error %#v: want the plugin's Err decoded", err)
	}
	if nets, err := p.Admin.Networks(); err != nil || len(nets) != 0 {
		t.Fatalf("Networks = %v, %v", nets, err)
	}
	if body, err := p.AdminGet("/v1/networks"); err != nil || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("AdminGet(/v1/networks) = %q, %v", body, err)
	}
	var raw []json.RawMessage
	if err := p.AdminJSON("/v1/networks", &raw); err != nil || len(raw) != 0 {
		t.Fatalf("AdminJSON(/v1/networks) = %v, %v", raw, err)
	}
	if _, err := p.AdminGet("/v1/nosuch"); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Fatalf("AdminGet of an unknown path: %v, want an HTTP 404 error", err)
	}
	if err := p.Stop(0); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !strings.Contains(p.LogTail(5), "fake plugin serving, advertise "+h.Underlay.String()) {
		t.Fatalf("log tail lacks the plugin's output:\n%s", p.LogTail(5))
	}

	p = start("exit1")
	if err := p.Stop(0); err == nil || !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("Stop of a plugin exiting 1: %v", err)
	}

	p = start("ignore-term")
	t0 := time.Now()
	if err := p.Stop(500 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Fatalf("Stop of a plugin ignoring SIGTERM: %v", err)
	}
	if p.Running() || time.Since(t0) > 5*time.Second {
		t.Fatalf("plugin still running (%v) or Stop too slow (%v)", p.Running(), time.Since(t0))
	}

	p = start("ignore-term")
	if err := p.Kill(); err != nil || p.Running() {
		t.Fatalf("Kill: %v, running %v", err, p.Running())
	}
	if err := p.Wait(time.Second); err == nil || !strings.Contains(exitText(err), "killed") {
		t.Fatalf("exit after Kill: %v", exitText(err))
	}

	// A binary that is not a plugin is reported quickly, with its output.
	_, err = h.StartPlugin(PluginConfig{Bin: "/bin/false", StartTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited during start-up") {
		t.Fatalf("StartPlugin(/bin/false): %v", err)
	}
	if pids, err := h.NS.Pids(); err != nil || len(pids) != 0 {
		t.Fatalf("processes left in the host: %v %v", pids, err)
	}
}
