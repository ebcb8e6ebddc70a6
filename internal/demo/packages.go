package demo

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// tools are the commands the testbed runs, with the Debian package of each.
// Probes and the plugin API need no ping or curl: they run in this process.
var tools = []struct{ cmd, pkg string }{
	{"ip", "iproute2"},
	{"bridge", "iproute2"},
	{"nsenter", "util-linux"},
}

// installMissing installs, with apt-get, the packages of the tools that are
// not on PATH, as the CI script does.
func installMissing(ctx context.Context, out *printer) error {
	var pkgs []string
	for _, t := range tools {
		if _, err := exec.LookPath(t.cmd); err != nil && !slices.Contains(pkgs, t.pkg) {
			pkgs = append(pkgs, t.pkg)
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	out.step("Installing missing packages: %s", strings.Join(pkgs, " "))
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("apt-get not found: install %s yourself", strings.Join(pkgs, " "))
	}
	// Another apt-get may hold the lock (unattended upgrades): wait for it.
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=400", "update"},
		append([]string{"-o", "DPkg::Lock::Timeout=400", "install", "-y", "--no-install-recommends"}, pkgs...),
	} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(b)))
		}
	}
	return nil
}
