package pluginapi_test

import (
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

// stubUnderlay is a host with one interface, stubVTEP, MTU 1500.
type stubUnderlay struct{}

var stubVTEP = netip.MustParseAddr("198.51.100.1")

func (stubUnderlay) DefaultAddr() (netip.Addr, error) { return stubVTEP, nil }
func (stubUnderlay) MTU(netip.Addr) (int, error)      { return 1500, nil }

// testLogger writes to the test log, so failures show the plugin's view.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testDriver struct {
	drv    *driver.Driver
	kernel *fakekernel.Kernel
	vnis   *vni.Allocator
}

func newTestDriver(t *testing.T) testDriver {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	vnis, err := vni.Open(db, vni.DefaultRange)
	if err != nil {
		t.Fatal(err)
	}
	k := fakekernel.New()
	d, err := driver.New(driver.Config{Kernel: k, Underlay: stubUnderlay{}, VNIs: vnis, VXLANPort: 4789, AdvertiseAddr: stubVTEP, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return testDriver{d, k, vnis}
}
