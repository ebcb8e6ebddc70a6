#!/usr/bin/env bash
# go-test.sh TEST_BINARY [-test.run REGEXP] [-test.v] [other test flags...]
# Runs a Go test binary inside the test VM (Debian's stock kernel, with ESP/GCM) as
# root and exits with its status. Build the binary first, statically:
#   CGO_ENABLED=0 GOEXPERIMENT=runtimesecret go test -c -o build/netlinkxfrm.test ./encryption/netlinkxfrm
# cwd in the guest is the repo root; `go test` would use the package directory:
# set OVERLAY_VM_CWD=$PWD/encryption if the tests read testdata/.
# Unless the flags set -test.timeout, it is set 30 s below the VM's hard timeout
# (OVERLAY_VM_TIMEOUT, default 600 s) so a hung test panics with its goroutine
# dump instead of being killed silently with the VM. Other env: see run.sh.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
bin=$(realpath -e -- "$1") || vm_die "no such test binary: $1"
shift
[[ -f $bin && -x $bin ]] || vm_die "not an executable file: $bin"
args=("$@")
if [[ " ${args[*]-} " != *" -test.timeout"* && " ${args[*]-} " != *" --test.timeout"* ]]; then
	vm_timeout=${OVERLAY_VM_TIMEOUT:-600}
	t=$((vm_timeout > 90 ? vm_timeout - 30 : vm_timeout * 2 / 3))
	args=(-test.timeout="${t}s" "${args[@]}")
fi
exec "$VM_DIR/run.sh" "$bin" "${args[@]}"
