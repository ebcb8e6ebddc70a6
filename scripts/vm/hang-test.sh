#!/usr/bin/env bash
# hang-test.sh: checks run.sh's watchdog for a hung guest kernel. The guest
# half reports a soft lockup the way the kernel does (a line on /dev/kmsg)
# and then waits, as a hung guest would:
#   once    on the first boot only (a marker in /vmshare remembers it): run.sh
#           must kill that boot, boot again and pass, saying why;
#   always  on every boot: run.sh must give up after its reboot, exit 126.
# Part of `make test-vm`; about 40 s.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ${1:-} == --in-guest ]]; then
	if [[ $2 == always || ! -e /vmshare/hung-once ]]; then
		: >/vmshare/hung-once
		echo '<4>watchdog: BUG: soft lockup - CPU#0 stuck for 999s! [hang-test:1]' >/dev/kmsg
		sleep 600
	fi
	echo "hang-test: the command ran on a boot that did not hang"
	exit 0
fi

fail() {
	echo "HANG-TEST: FAIL: $*"
	exit 1
}
run() { # run MODE: run.sh's output; its exit status in $rc
	rc=0
	OVERLAY_VM_TIMEOUT=300 OVERLAY_VM_QUIET=1 "$here/run.sh" "$here/hang-test.sh" --in-guest "$1" >"$tmp/$1.out" 2>&1 || rc=$?
	cat "$tmp/$1.out"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run once
((rc == 0)) || fail "one hang: run.sh exited $rc, want 0 after one reboot"
grep -q '^VM: PASS after a reboot for a hung guest kernel (boot 1: soft lockup - CPU#0 stuck for 999s)$' "$tmp/once.out" ||
	fail "one hang: no 'VM: PASS after a reboot ...' line naming the lockup"
grep -q '^hang-test: the command ran' "$tmp/once.out" || fail "one hang: the second boot did not run the command"

run always
((rc == 126)) || fail "a hang on every boot: run.sh exited $rc, want 126"
grep -q '^VM: FAIL (the guest kernel hung on each of 2 boots: ' "$tmp/always.out" ||
	fail "a hang on every boot: no 'VM: FAIL (the guest kernel hung ...)' line"
echo "HANG-TEST: PASS"
