#!/bin/bash
# PID 1 inside the test VM, started by the initramfs with the host's bash after
# switch_root. Reads the job that run.sh wrote to /vmshare/job, runs it with the
# repo as cwd, tees its output to the console and /vmshare/output, writes its exit
# status to /vmshare/status and powers the VM off.
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LC_ALL=C.UTF-8
unset vminit
share=/vmshare
read -r t0 _ </proc/uptime

VM_BUSYBOX=
poweroff_now() {
	sync
	[[ -x $VM_BUSYBOX ]] && "$VM_BUSYBOX" poweroff -f
	echo o >/proc/sysrq-trigger
	sleep 60
}
trap poweroff_now EXIT

# The root is the host's / (read-only 9p) under a tmpfs overlay: give the guest its
# own /run (hides the host's sockets and /run/netns), /dev/pts, /dev/shm, cgroup2.
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -p /run/lock /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true
# devtmpfs has no /dev/fd: bash's process substitution, <(...), needs it.
ln -sfn /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
echo overlay-vm >/proc/sys/kernel/hostname
ip link set lo up

if [[ ! -f $share/job ]]; then
	echo "vm-guest: no $share/job" >&2
	exit 1
fi
VM_CWD=/ VM_ARGV=() VM_ENV=()
# shellcheck disable=SC1091
. "$share/job"
for kv in "${VM_ENV[@]}"; do export "${kv?}"; done

echo "vm-guest: kernel $(uname -r), up ${t0}s; running: ${VM_ARGV[*]}"
rc=
if cd "$VM_CWD"; then
	("${VM_ARGV[@]}") </dev/null 2>&1 | tee "$share/output"
	rc=${PIPESTATUS[0]}
else
	rc=126
fi
read -r t1 _ </proc/uptime
echo "vm-guest: exit status $rc, booted to command in ${t0}s, command took $(awk "BEGIN{print $t1-$t0}")s"
printf '%s %s\n' "$t0" "$t1" >"$share/uptime"
printf '%s\n' "$rc" >"$share/status.tmp"
mv "$share/status.tmp" "$share/status"
sync
