package enginewatch

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/dockerengine"
	"github.com/overlay-plugin/overlay-plugin/dockerengine/enginetest"
)

// BenchmarkServicesRound measures what one round of the services watch
// costs at 1,000 services of 3 tasks on a network (issue 24): the ask of
// the real client to the fake engine over a unix socket and the
// translation. The engine's API (GET /networks/<id>?verbose=true) has no
// filter and no "since": every round asks for every service. Reported:
// the answer's bytes per round, and the CPU time per round of the whole
// process (client and fake engine: an upper bound of the plugin's).
func BenchmarkServicesRound(b *testing.B) {
	e := enginetest.New()
	var svcs []dockerengine.Service
	for i := range 1000 {
		s := dockerengine.Service{Name: fmt.Sprintf("service-%04d", i), VIP: fmt.Sprintf("10.0.%d.%d", 128+i/250, 2+i%250),
			Ports: []string{"Target: 80, Publish: 8080"}}
		for j := range 3 {
			s.Tasks = append(s.Tasks, dockerengine.Task{Name: fmt.Sprintf("service-%04d.%d.abcdefghijklmnopqrstuvwxy", i, j+1),
				EndpointID: fmt.Sprintf("%064x", i*3+j), EndpointIP: fmt.Sprintf("10.0.%d.%d", i*3/250, 2+(i*3+j)%250)})
		}
		svcs = append(svcs, s)
	}
	e.SetServices("n1", svcs...)
	sock := filepath.Join(b.TempDir(), "docker.sock")
	e.Serve(b, sock)
	size := answerBytes(b, sock)
	c := dockerengine.New(sock)
	defer c.Close()
	ctx := context.Background()
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		raw, err := c.NetworkServices(ctx, "n1")
		if err != nil {
			b.Fatal(err)
		}
		if got, _ := Translate(raw); len(got) != 1000 {
			b.Fatalf("%d services", len(got))
		}
	}
	b.ReportMetric((cpuTime()-cpu0)/float64(b.N)/1e6, "cpu-ms/round")
	b.ReportMetric(float64(size), "bytes/round")
}

// answerBytes is the size of the engine's answer to one round's ask.
func answerBytes(b *testing.B, sock string) int64 {
	hc := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://docker/networks/n1?verbose=true")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func cpuTime() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano() + ru.Stime.Nano())
}
