#!/usr/bin/env bash
# scripts/test.sh: the whole test suite, what `make test` runs, layer by layer:
#   go      go vet, then go test -race over every package: unit tests on the
#           fake kernel, concurrency stress, privileged tests in throwaway
#           namespaces, multi-host and gossip tests and the demo with the
#           real binary, the 10-host scale run (make test-go)
#   vm      the IPsec data path on Debian's stock kernel under qemu, since
#           this machine's kernel has no ESP (make test-vm)
#   docker  a real Docker engine and two-node swarm, each dockerd in a
#           namespace of its own, data-path port 4790 (scripts/e2e-docker.sh)
#   vm-docker  the same swarm inside the VM, whose kernel has ESP: encrypted
#           networks working, rotating keys, never in clear on the wire
#           (scripts/e2e-docker-vm.sh, make test-vm-docker)
# Every layer runs even if an earlier one failed, so one run shows them all.
# The vm, docker and vm-docker layers need root: without it they are reported SKIPPED
# with the reason, and a skip is never a pass. Exit status: non-zero if any
# layer failed or was skipped.
#
# TEST_LAYERS="go vm docker vm-docker" (the default) selects layers.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

log() { printf '==> %s\n' "$*"; }

declare -a passed=() failed=() skipped=()
layer() {
	local name=$1; shift
	if [[ " ${TEST_LAYERS:-go vm docker vm-docker} " != *" $name "* ]]; then
		return
	fi
	if [[ $name != go && $(id -u) -ne 0 ]]; then
		log "$name: SKIPPED: needs root (it installs packages, boots qemu or runs dockerd in network namespaces)"
		skipped+=("$name")
		return
	fi
	local t0=$SECONDS
	log "$name: $*"
	if "$@"; then
		log "$name: passed ($((SECONDS - t0))s)"
		passed+=("$name")
	else
		log "$name: FAILED ($((SECONDS - t0))s)"
		failed+=("$name")
	fi
}

layer go make --no-print-directory test-go
layer vm make --no-print-directory test-vm
# The Docker layer's swarm uses another data-path port than Docker's
# default, which the plugin must follow (the VM's keeps 4789): 0.1.0 in
# the upgrade phase keeps 4789, the fresh installs take 4790.
layer docker env E2E_DATA_PATH_PORT="${E2E_DATA_PATH_PORT-4790}" bash scripts/e2e-docker.sh
layer vm-docker bash scripts/e2e-docker-vm.sh

log "layers passed: ${passed[*]:-none}; failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}"
((${#failed[@]} == 0 && ${#skipped[@]} == 0))
