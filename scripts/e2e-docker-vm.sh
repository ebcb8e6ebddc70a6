#!/usr/bin/env bash
# scripts/e2e-docker-vm.sh: the Docker end-to-end test (scripts/e2e-docker.sh)
# inside the test VM (scripts/vm: Debian's stock kernel under qemu), whose
# kernel has the ESP that this machine's lacks, so encrypted networks must
# work there (E2E_EXPECT_ESP=1): two dockerd in namespaces, a swarm, the
# managed plugin, and the checks listed below. Root only; `make test-vm-docker`.
#
# The guest runs this machine's userland, so everything is installed and
# built here before the boot: the harness's packages (e2e_install_packages,
# scripts/e2e/lib.sh), bin/overlay-plugin, build/plugin and the Go checks'
# static test binary build/e2e/dockere2e.test (e2e_build_plugin; Go would
# spend a minute linking under emulation, and the guest has none). The
# guest installs build/plugin with plugin/install.sh, what the README's `make
# plugin-install` runs (the host's Docker layer runs that command itself).
#
# Environment: E2E_CHECKS (the check functions, default below), and
# OVERLAY_VM_* (scripts/vm/run.sh; defaults here: 3 GiB, 2 CPUs, multi-threaded
# TCG, a 60-minute limit, two boots more after a hung guest kernel). Prints
# scripts/e2e-docker.sh's results, then `VM: PASS` or `VM: FAIL (...)`; exits
# non-zero on any failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/e2e/lib.sh
source "$here/e2e/lib.sh"
# shellcheck source=scripts/e2e/upgrade.sh
source "$here/e2e/upgrade.sh"
[[ $EUID -eq 0 ]] || die "run as root"
[[ -d /usr/local/go/bin ]] && PATH=$PATH:/usr/local/go/bin

e2e_install_packages
E2E_SKIP_BUILD=0 e2e_build_plugin || die "building the plugin failed"
# The previous release too, for check_upgrade (the guest pushes both to its
# registry); without the commit in the history the guest's check fails
# with that reason.
E2E_SKIP_BUILD=0 e2e_build_prev_plugin || warn "the previous release ($E2E_UPGRADE_FROM) could not be built: check_upgrade will fail"

# What needs ESP, and what Docker shows of it: the encrypted network with a
# service and containers, the key rotation and the capture
# (check_plugin_encrypted), the restart of the plugin under it
# (check_disable_enable), the README's example as written, --opt encrypted
# included (check_readme_docker), the plugin's logs (check_plugin_logs), and
# the rolling upgrade from the previous release on an encrypted network
# (check_upgrade: its IPsec state handed over from one release to the next).
export E2E_CHECKS=${E2E_CHECKS:-check_upgrade check_readme_docker check_plugin_encrypted check_disable_enable check_plugin_logs}
# Two boots after a hung guest kernel, not one: this run starts the most
# containers, and CI saw it hang on two boots in a row (before the guest
# got cgroup.memory=nokmem, vm/README.md) and fail with nothing tested.
# A hang costs OVERLAY_VM_HANG_SECS (4 minutes) before the next boot.
export OVERLAY_VM_MEM=${OVERLAY_VM_MEM:-3072} OVERLAY_VM_TIMEOUT=${OVERLAY_VM_TIMEOUT:-3600}
export OVERLAY_VM_HANG_REBOOTS=${OVERLAY_VM_HANG_REBOOTS:-2}
export OVERLAY_VM_PASSENV="${OVERLAY_VM_PASSENV:-} E2E_CHECKS"
exec "$here/vm/run.sh" "$here/vm/e2e-docker-guest.sh"
