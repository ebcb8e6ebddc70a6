#!/usr/bin/env bash
# scripts/vagrant/run.sh [VAGRANT ARGS...]: the Vagrantfile run offline on a
# machine like CI's: the box built from Debian's packages (build-box.sh, once),
# the plugin built on the host, libvirtd in its own netns (libvirt-ns.sh), then
# `vagrant up` (default) which provisions node1..3 and runs the e2e checks on
# node3. Afterwards the VMs, networks, libvirtd and the netns are removed
# unless VAGRANT_KEEP=1. Output: "e2e: N passed, M failed" from node3.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export VAGRANT_BOX=${VAGRANT_BOX:-overlay/bookworm64}
export VAGRANT_DEFAULT_PROVIDER=libvirt
# libvirt-ns.sh's underlay floods every frame: node3 can watch the wire.
export E2E_WIRE_HUB=1
log() { printf '%s [vagrant] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

VAGRANT_BOX_NAME=$VAGRANT_BOX bash "$here/build-box.sh"
make -C "$root" build >&2
# The Go checks' test binary too: node3 may have no Go.
# shellcheck source=scripts/e2e/lib.sh
(source "$root/scripts/e2e/lib.sh" && e2e_build_gotest)
bash "$here/libvirt-ns.sh" start
cleanup() {
	[[ ${VAGRANT_KEEP:-0} == 1 ]] && { log "kept: VMs running, see scripts/vagrant/README.md"; return; }
	(cd "$root" && bash "$here/libvirt-ns.sh" exec vagrant destroy -f) || true
	bash "$here/libvirt-ns.sh" stop
}
trap cleanup EXIT
T0=$SECONDS
cd "$root"
bash "$here/libvirt-ns.sh" exec vagrant "${@:-up}"
log "vagrant ${*:-up} took $((SECONDS - T0))s"
