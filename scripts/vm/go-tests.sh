#!/usr/bin/env bash
# go-tests.sh TEST_BINARY... [-- TEST FLAGS...]
# Runs several Go test binaries inside ONE boot of the test VM (Debian's stock
# kernel, with ESP/GCM), one after the other, each with the same TEST FLAGS
# (e.g. -test.v -test.count=1), as root, cwd the repo root. Build them first,
# statically:
#   CGO_ENABLED=0 GOEXPERIMENT=runtimesecret go test -c -o build/vm/netlinkxfrm.test ./encryption/netlinkxfrm
# Prints, for each binary, `VM-TEST: PASS NAME (SECONDS)` or
# `VM-TEST: FAIL NAME (exit STATUS, SECONDS)` (after the last lines of each
# failed test again: scripts/vm/fail-summary.awk), then one summary line,
# `VM-TESTS: PASS (N binaries)` or `VM-TESTS: FAIL (K of N failed: NAMES)`, then
# run.sh's `VM: PASS` / `VM: FAIL (...)`. Exits 0 only if every binary passed.
# Unless the flags set -test.timeout, each binary gets what is left of the VM's
# hard timeout (OVERLAY_VM_TIMEOUT, default 600 s) minus 20 s, so a hung test
# panics with its goroutine dump instead of being killed silently with the VM.
# OVERLAY_PLUGIN_BIN, if set, is passed into the guest. Other env: see run.sh.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

if [[ ${1:-} == --in-guest ]]; then
	# Inside the VM: --in-guest VM_TIMEOUT BINARY... -- FLAGS...
	vm_timeout=$2
	shift 2
	bins=()
	while [[ $# -gt 0 && $1 != -- ]]; do
		bins+=("$1")
		shift
	done
	[[ ${1:-} == -- ]] && shift
	flags=("$@")
	set_timeout=1
	[[ " ${flags[*]-} " == *" -test.timeout"* || " ${flags[*]-} " == *" --test.timeout"* ]] && set_timeout=0
	uptime_s() { awk '{printf "%d", $1}' /proc/uptime; }
	failed=()
	for bin in "${bins[@]}"; do
		name=${bin##*/}
		args=("${flags[@]}")
		if ((set_timeout)); then
			# The host's deadline started a few seconds before the guest's clock.
			left=$((vm_timeout - $(uptime_s) - 20))
			if ((left < 30)); then
				echo "VM-TEST: FAIL $name (not run: only ${left}s left of the VM timeout)"
				failed+=("$name")
				continue
			fi
			args=(-test.timeout="${left}s" "${args[@]}")
		fi
		echo "=== VM-TEST: RUN $name ${args[*]}"
		t0=$(awk '{print $1}' /proc/uptime)
		out=/tmp/$name.out
		set +e
		"$bin" "${args[@]}" 2>&1 | tee "$out"
		rc=${PIPESTATUS[0]}
		set -e
		((rc == 0)) || awk -f "$VM_DIR/fail-summary.awk" "$out"
		took=$(awk -v a="$t0" '{printf "%.1fs", $1-a}' /proc/uptime)
		if ((rc == 0)); then
			echo "VM-TEST: PASS $name ($took)"
		else
			echo "VM-TEST: FAIL $name (exit $rc, $took)"
			failed+=("$name")
		fi
	done
	if ((${#failed[@]} == 0)); then
		echo "VM-TESTS: PASS (${#bins[@]} binaries)"
		exit 0
	fi
	echo "VM-TESTS: FAIL (${#failed[@]} of ${#bins[@]} failed: ${failed[*]})"
	exit 1
fi

[[ $# -lt 1 || $1 == -h || $1 == --help || $1 == -- ]] && usage
bins=()
while [[ $# -gt 0 && $1 != -- ]]; do
	b=$(realpath -e -- "$1") || vm_die "no such test binary: $1"
	[[ -f $b && -x $b ]] || vm_die "not an executable file: $b"
	bins+=("$b")
	shift
done
[[ ${1:-} == -- ]] && shift
if [[ -n ${OVERLAY_PLUGIN_BIN:-} ]]; then
	OVERLAY_PLUGIN_BIN=$(realpath -e -- "$OVERLAY_PLUGIN_BIN") || vm_die "OVERLAY_PLUGIN_BIN: no such file"
	export OVERLAY_PLUGIN_BIN
	[[ " ${OVERLAY_VM_PASSENV:-} " == *" OVERLAY_PLUGIN_BIN "* ]] ||
		export OVERLAY_VM_PASSENV="${OVERLAY_VM_PASSENV:-} OVERLAY_PLUGIN_BIN"
fi
self=$(realpath -e -- "${BASH_SOURCE[0]}")
exec "$VM_DIR/run.sh" "$self" --in-guest "${OVERLAY_VM_TIMEOUT:-600}" "${bins[@]}" -- "$@"
