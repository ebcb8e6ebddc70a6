#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2054 # functions run from traps; commas inside qemu option values
# run.sh SCRIPT [ARGS...]
# Boots Debian's stock kernel under qemu (TCG, no KVM, no network) on THIS machine's
# userland (host / shared read-only over virtio-9p under a tmpfs overlay) and runs
# SCRIPT ARGS... there as root, cwd the repo root. Streams the guest console, then
# exits with SCRIPT's exit status and prints `VM: PASS` or `VM: FAIL (reason)`.
#
# Env: OVERLAY_VM_TIMEOUT  hard timeout in seconds for the whole VM run (default 600)
#      OVERLAY_VM_CWD      cwd inside the guest (default: the repo root)
#      OVERLAY_VM_PASSENV  space-separated names of host env variables to pass in
#      OVERLAY_VM_MEM / OVERLAY_VM_SMP   guest RAM in MiB (1024) / CPUs (2)
#      OVERLAY_VM_ACCEL    qemu -accel value (default tcg,thread=multi)
#      OVERLAY_VM_QEMU_ARGS  extra qemu arguments (split on white space)
#      OVERLAY_VM_QUIET=1  don't stream the console; print the command's output at the end
#      OVERLAY_VM_OUTPUT   copy the command's output (stdout+stderr) to this file
#      OVERLAY_VM_SHARE    host dir to use as the guest's writable /vmshare (default: temp)
#      OVERLAY_VM_KEEP=1   keep the run directory (console log, share) and print its path
#      OVERLAY_VM_HANG_SECS  a guest CPU stuck in its kernel this long (the soft-lockup
#                          watchdog's report) is a hung guest (default 240)
#      OVERLAY_VM_HANG_REBOOTS  boots again after a hung guest, at most this often (default 1)
#      OVERLAY_VM_CACHE, OVERLAY_VM_KVER: see ensure-kernel.sh
# A hung guest is the emulator's or the guest kernel's failure, not the
# command's: under multi-threaded TCG, Debian's kernel has hung now and then
# (about once in 25 boots) with every vCPU spinning in the kernel, e.g. in
# cgroup_mkdir under runc. Waiting for the timeout then costs the whole run,
# so the console is watched and such a guest is killed and booted again from
# scratch (the guest keeps nothing but /vmshare, which is reset), said on the
# console and in the final line.
# Exit status: the command's; 124 on timeout; 125 if the VM produced no exit status;
# 126 if the guest hung on its last boot.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

vm_die() {
	printf 'vm: error: %s\n' "$*" >&2
	echo "VM: FAIL ($*)"
	exit 125
}

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
	sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
fi
script=$(realpath -e -- "$1") || vm_die "no such file: $1"
shift
if [[ -x $script ]]; then argv=("$script" "$@"); else argv=(/bin/bash "$script" "$@"); fi

timeout=${OVERLAY_VM_TIMEOUT:-600}
[[ $timeout =~ ^[0-9]+$ ]] || vm_die "OVERLAY_VM_TIMEOUT must be a number of seconds"
cwd=$(realpath -e -- "${OVERLAY_VM_CWD:-$VM_REPO_ROOT}")
guest_init=$VM_DIR/guest-init.sh
[[ $guest_init != *[[:space:]]* ]] || vm_die "the repo path must not contain white space: $guest_init"

t_start=$(date +%s.%N)
declare -A ek=()
while IFS='=' read -r k v; do
	case $k in OVERLAY_VM_*) ek[$k]=$v ;; esac
done < <("$VM_DIR/ensure-kernel.sh")
kernel=${ek[OVERLAY_VM_KERNEL]:-} initrd=${ek[OVERLAY_VM_INITRD]:-} busybox=${ek[OVERLAY_VM_BUSYBOX]:-}
[[ -f $kernel && -f $initrd && -x $busybox ]] || vm_die "ensure-kernel.sh failed (no kernel, initrd or busybox)"

rundir=$(mktemp -d "${TMPDIR:-/tmp}/overlay-vm.XXXXXX")
share=${OVERLAY_VM_SHARE:-$rundir/share}
mkdir -p "$share"
share=$(realpath -e "$share")
rm -f "$share"/{job,output,status,status.tmp,uptime}
console=
qpid='' streampid=''
cleanup() {
	local rc=$?
	if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
		kill -KILL "$qpid" 2>/dev/null || true
		wait "$qpid" 2>/dev/null || true
	fi
	# The console streamer (tail --pid) ends by itself within 0.2 s of qemu.
	[[ -z $streampid ]] || wait "$streampid" 2>/dev/null || true
	if [[ ${OVERLAY_VM_KEEP:-0} == 1 ]]; then
		vm_log "kept run directory $rundir"
	else
		rm -rf "$rundir"
	fi
	exit "$rc"
}
trap cleanup EXIT
interrupted() {
	trap - INT TERM
	echo "VM: FAIL (interrupted by SIG$1)"
	exit "$2"
}
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM

{
	printf 'VM_CWD=%q\n' "$cwd"
	printf 'VM_BUSYBOX=%q\n' "$busybox"
	printf 'VM_ARGV=('
	printf '%q ' "${argv[@]}"
	printf ')\nVM_ENV=('
	for name in ${OVERLAY_VM_PASSENV:-}; do
		[[ -v $name ]] && printf '%q ' "$name=${!name}"
	done
	printf ')\n'
} >"$share/job"

# SeaBIOS writes its banner and terminal resets to the serial port unless told not to.
head -c 8 /dev/zero >"$rundir/sercon-port"
esc() { printf '%s' "${1//,/,,}"; } # qemu option values: ',' is written ',,'
qemu_argv() { # the qemu command line for a boot whose console goes to $1
	local console=$1
	qemu=(qemu-system-x86_64
		-name overlay-plugin-vm
		-m "${OVERLAY_VM_MEM:-1024}" -smp "${OVERLAY_VM_SMP:-2}" -accel "${OVERLAY_VM_ACCEL:-tcg,thread=multi}"
		-nographic -no-reboot -nic none -monitor none
		-serial "file:$(esc "$console")"
		-fw_cfg "name=etc/sercon-port,file=$(esc "$rundir/sercon-port")"
		-kernel "$kernel" -initrd "$initrd"
		# Not quiet: a lockup's backtraces (KERN_WARNING) must reach the console.
		# cgroup.memory=nokmem: the hangs under multi-threaded TCG were each
		# vCPU looping on an int3 in kmem_cache_alloc, the site the kernel
		# patches live when runc's first memory cgroup turns on kernel-memory
		# accounting (a static key); without the accounting the key never
		# flips and that code is never patched.
		-append "console=ttyS0 loglevel=6 softlockup_all_cpu_backtrace=1 panic=-1 cgroup.memory=nokmem vminit=$guest_init"
		-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap
		-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
		-fsdev "local,id=hostshare,path=$(esc "$share"),security_model=none,multidevs=remap"
		-device virtio-9p-pci,fsdev=hostshare,mount_tag=hostshare
		-device virtio-rng-pci
	)
		# shellcheck disable=SC2206 # word splitting intended
	qemu+=(${OVERLAY_VM_QEMU_ARGS:-})
}

hang_secs=${OVERLAY_VM_HANG_SECS:-240} hang_reboots=${OVERLAY_VM_HANG_REBOOTS:-1}
[[ $hang_secs =~ ^[0-9]+$ && $hang_reboots =~ ^[0-9]+$ ]] || vm_die "OVERLAY_VM_HANG_SECS and OVERLAY_VM_HANG_REBOOTS must be numbers"
# guest_hang prints the console's first report of a CPU stuck for at least
# hang_secs, nothing if there is none. The kernel repeats its report, with the
# time growing, for as long as the CPU stays stuck.
guest_hang() {
	grep -a -o -E 'soft lockup - CPU#[0-9]+ stuck for [0-9]+s' "$console" 2>/dev/null |
		awk -v min="$hang_secs" '{ s = $NF; sub(/s$/, "", s); if (s + 0 >= min) { print; exit } }' || true
}

stop_qemu() {
	kill -TERM "$qpid" 2>/dev/null || true
	for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$qpid" 2>/dev/null || break; sleep 0.2; done
	kill -KILL "$qpid" 2>/dev/null || true
}

boots=0 hangs=''
while :; do
	boots=$((boots + 1))
	console=$rundir/console.$boots.log
	: >"$console"
	rm -f "$share"/{output,status,status.tmp,uptime}
	qemu_argv "$console"
	t_boot=$(date +%s.%N)
	"${qemu[@]}" </dev/null >"$rundir/qemu.log" 2>&1 &
	qpid=$!
	if [[ ${OVERLAY_VM_QUIET:-0} != 1 ]]; then
		(tail -n +1 -s 0.2 -F --pid="$qpid" "$console" 2>/dev/null | tr -d '\r') &
		streampid=$!
	fi

	timed_out=0 hung=''
	deadline=$((SECONDS + timeout)) next_look=$((SECONDS + 5))
	while kill -0 "$qpid" 2>/dev/null; do
		if ((SECONDS >= deadline)); then
			timed_out=1
			stop_qemu
			break
		fi
		if ((SECONDS >= next_look)); then
			next_look=$((SECONDS + 5))
			hung=$(guest_hang)
			if [[ -n $hung ]]; then
				stop_qemu
				break
			fi
		fi
		sleep 0.2
	done
	qrc=0
	wait "$qpid" || qrc=$?
	qpid=
	t_end=$(date +%s.%N)
	if [[ -n $streampid ]]; then
		wait "$streampid" || true
		streampid=
	fi
	[[ -n $hung ]] || break
	hangs+="${hangs:+; }boot $boots: $hung"
	echo "vm: the guest kernel hung on boot $boots ($hung), not the command: qemu killed"
	((boots <= hang_reboots)) || break
	echo "vm: booting again ($boots of $hang_reboots reboots after a hang)"
done

if [[ -n ${OVERLAY_VM_OUTPUT:-} && -f $share/output ]]; then
	cp "$share/output" "$OVERLAY_VM_OUTPUT"
fi
timing=$(awk -v a="$t_start" -v b="$t_boot" -v c="$t_end" 'BEGIN{printf "setup %.1fs, VM %.1fs, total %.1fs", b-a, c-b, c-a}')
if [[ -f $share/uptime ]]; then
	timing+=$(awk '{printf " (guest: booted to command in %.1fs, command %.1fs)", $1, $2-$1}' "$share/uptime")
fi

show_console_tail() {
	echo "---- guest console, last 40 lines ----"
	tail -n 40 "$console" | tr -d '\r'
	echo "---- qemu exited with status $qrc ----"
	grep -v 'fw_cfg item names should be prefixed' "$rundir/qemu.log" | tail -n 20 || true
}

status=
[[ -f $share/status ]] && status=$(<"$share/status")
echo "vm: $timing"
if [[ -n $hung ]]; then
	show_console_tail
	echo "VM: FAIL (the guest kernel hung on each of $boots boots: $hangs)"
	exit 126
elif ((timed_out)); then
	show_console_tail
	echo "VM: FAIL (timeout after ${timeout}s; qemu killed)"
	exit 124
elif [[ ! $status =~ ^[0-9]+$ ]]; then
	show_console_tail
	echo "VM: FAIL (no exit status from the guest; qemu exited $qrc)"
	exit 125
fi
if [[ ${OVERLAY_VM_QUIET:-0} == 1 && -f $share/output ]]; then
	cat "$share/output"
fi
after=''
[[ -z $hangs ]] || after=" after a reboot for a hung guest kernel ($hangs)"
if ((status == 0)); then
	echo "VM: PASS$after"
else
	echo "VM: FAIL (guest command exited $status$after)"
fi
exit "$status"
