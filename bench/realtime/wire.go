package realtime

import (
	"sync"
	"sync/atomic"

	metrics "github.com/hashicorp/go-metrics"
)

// wireCounter counts the bytes memberlist writes to its sockets. Both
// systems gossip through memberlist's NetTransport, which reports every
// datagram and stream write as the counters memberlist.udp.sent and
// memberlist.tcp.sent (after compression and encryption, before the
// IP/UDP/TCP headers). The sink is process-wide, which is right because the
// systems never run at the same time.
type wireCounter struct {
	udp, tcp atomic.Uint64
}

var (
	wire     wireCounter
	wireOnce sync.Once
)

// installWireCounter makes wire the global go-metrics sink.
func installWireCounter() {
	wireOnce.Do(func() {
		cfg := metrics.DefaultConfig("")
		cfg.EnableHostname = false
		// The runtime collector would stop the world every second.
		cfg.EnableRuntimeMetrics = false
		if _, err := metrics.NewGlobal(cfg, &wire); err != nil {
			panic(err) // only fails on a bad filter configuration
		}
	})
}

func (w *wireCounter) snapshot() (udp, tcp uint64) { return w.udp.Load(), w.tcp.Load() }

func (w *wireCounter) IncrCounterWithLabels(key []string, val float32, _ []metrics.Label) {
	w.IncrCounter(key, val)
}

func (w *wireCounter) IncrCounter(key []string, val float32) {
	if len(key) < 3 || key[len(key)-1] != "sent" || key[len(key)-3] != "memberlist" {
		return
	}
	switch key[len(key)-2] {
	case "udp":
		w.udp.Add(uint64(val))
	case "tcp":
		w.tcp.Add(uint64(val))
	}
}

func (*wireCounter) SetGauge([]string, float32)                             {}
func (*wireCounter) SetGaugeWithLabels([]string, float32, []metrics.Label)  {}
func (*wireCounter) EmitKey([]string, float32)                              {}
func (*wireCounter) AddSample([]string, float32)                            {}
func (*wireCounter) AddSampleWithLabels([]string, float32, []metrics.Label) {}
