package pluginapi_test

import (
	"log/slog"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/driver/drivertest"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
	"github.com/overlay-plugin/overlay-plugin/vni"
)

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
	vnis := drivertest.VNIs(t, drivertest.StateDB(t))
	k := fakekernel.New()
	d, err := driver.New(driver.Config{Kernel: k, Underlay: drivertest.Underlay{Addr: drivertest.VTEP}, VNIs: vnis, VXLANPort: 4789, AdvertiseAddr: drivertest.VTEP, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return testDriver{d, k, vnis}
}
