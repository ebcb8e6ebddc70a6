package layering

import (
	"go/build"
	"strings"
	"testing"
)

const module = "github.com/overlay-plugin/overlay-plugin/"

// rules: a package (left) must not depend, directly or through other
// packages of this module, on any of the packages on the right. Test files
// are exempt: a test may wire real parts together.
var rules = map[string][]string{
	"driver":     {"encryption", "firewall", "cluster"},
	"firewall":   {"encryption", "driver"},
	"kernel":     {"encryption", "driver", "cluster", "firewall"},
	"peerdb":     {"encryption", "driver", "cluster", "kernel"},
	"vni":        {"encryption", "driver", "cluster", "kernel"},
	"cluster":    {"encryption", "driver", "kernel", "firewall"},
	"servicelb":  {"encryption", "driver", "cluster", "kernel"},
	"encryption": {"driver", "cluster", "firewall", "kernel"},
	// xfrm's implementations serve the manager and know nothing above it.
	"encryption/netlinkxfrm": {"driver", "cluster", "firewall", "kernel"},
	"encryption/fakexfrm":    {"driver", "cluster", "firewall", "kernel"},
	// Docker's protocol over any driver: it knows no part of this one.
	"pluginapi": {"driver", "cluster", "encryption", "kernel", "firewall", "adminapi", "metrics"},
	// The namespace primitive is a leaf every kernel-facing package uses.
	"internal/nsthread": {"encryption", "driver", "cluster", "kernel", "firewall", "servicelb"},
	// The engine's client is a leaf; its pollers hand what they learn to
	// the driver and nothing else.
	"dockerengine": {"driver", "cluster", "encryption", "kernel", "vni"},
	"enginewatch":  {"cluster", "encryption", "firewall"},
	// The control plane is handed its xfrm and firewall; it serves no API.
	"controlplane": {"firewall", "encryption/netlinkxfrm", "pluginapi", "adminapi"},
	// The prober is handed its peers and what the control plane says of
	// them; it programs its own endpoints through the kernel.
	"health": {"driver", "cluster", "encryption", "firewall", "controlplane"},
	// Socket plumbing knows nothing of what is served on it.
	"internal/unixsock": {"driver", "cluster", "encryption", "kernel", "pluginapi", "adminapi"},
	// Fakes and test harnesses never ship in the binary.
	"cmd/overlay-plugin": {"kernel/fakekernel", "kernel/kerneltest", "encryption/fakexfrm", "encryption/xfrmtest", "servicelb/fakelb",
		"firewall/firewalltest", "dockerengine/enginetest", "pluginapi/pluginapitest",
		"internal/testns", "internal/testbed", "driver/drivertest"},
}

func TestImportRules(t *testing.T) {
	for pkg, forbidden := range rules {
		deps := map[string][]string{} // dependency -> path to it
		walk(t, pkg, []string{pkg}, deps)
		for _, f := range forbidden {
			if path, ok := deps[f]; ok {
				t.Errorf("%s must not depend on %s, but does: %s", pkg, f, strings.Join(path, " -> "))
			}
		}
	}
}

// walk records every package of this module that pkg imports, directly or
// not, with one import path leading to it.
func walk(t *testing.T, pkg string, path []string, deps map[string][]string) {
	p, err := build.Import(module+pkg, "", 0)
	if err != nil {
		t.Fatalf("import %s: %v", pkg, err)
	}
	for _, imp := range p.Imports {
		dep, ok := strings.CutPrefix(imp, module)
		if !ok {
			continue
		}
		if _, seen := deps[dep]; seen {
			continue
		}
		deps[dep] = append(append([]string(nil), path...), dep)
		walk(t, dep, deps[dep], deps)
	}
}
