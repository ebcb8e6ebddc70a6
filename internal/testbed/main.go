package testbed

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Main is the TestMain of a package built on the testbed: namespaces that
// dead runs left are swept first, this run's after (a leftover fails the
// run), and a plugin binary built for the run is removed.
func Main(m *testing.M, pkg string) {
	if Check() == nil {
		if err := SweepStale(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: sweeping namespaces of dead runs: %v\n", pkg, err)
		}
	}
	code := m.Run()
	if err := Sweep(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: namespaces left by this run could not be removed: %v\n", pkg, err)
		code = cmp.Or(code, 1)
	}
	RemoveBuiltPlugin()
	os.Exit(code)
}

// Requirement decides once per test binary whether its tests can run here:
// the testbed's own Check, then the package's extra checks in order.
type Requirement struct {
	pkg   string
	extra []func() error
	once  sync.Once
	err   error
}

// NewRequirement builds the requirement of package pkg.
func NewRequirement(pkg string, extra ...func() error) *Requirement {
	return &Requirement{pkg: pkg, extra: extra}
}

// RequireEnv names packages, space-separated, whose tests must run: where
// one of them cannot, its tests fail instead of skipping. The VM run sets it
// for the packages that exist to run there: the encrypted scenario and
// the xfrm netlink tests that need ESP.
const RequireEnv = "OVERLAY_TEST_REQUIRE"

// Required reports whether RequireEnv names pkg: its tests must run.
func Required(pkg string) bool {
	return slices.Contains(strings.Fields(os.Getenv(RequireEnv)), pkg)
}

// Require skips t unless the requirement holds; the reason is printed once,
// even without -v, so a skipped layer never passes silently. Packages named
// in RequireEnv fail instead.
func (r *Requirement) Require(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.err = Check()
		for _, f := range r.extra {
			if r.err != nil {
				break
			}
			r.err = f()
		}
		if r.err != nil {
			fmt.Printf("%s: SKIP all tests: %v\n", r.pkg, r.err)
		}
	})
	if r.err != nil {
		if Required(r.pkg) {
			t.Fatalf("cannot run here, and %s requires it: %v", RequireEnv, r.err)
		}
		t.Skipf("cannot run here: %v", r.err)
	}
}
