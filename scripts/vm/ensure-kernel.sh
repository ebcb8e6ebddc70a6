#!/usr/bin/env bash
# Prepare everything the test VM needs, idempotently:
#   * host packages: qemu-system-x86, cpio, kmod, iproute2, gzip (apt, only if missing)
#   * Debian's stock kernel (the linux-image-<ver>-amd64 that linux-image-amd64 depends on),
#     downloaded with `apt-get download`, unpacked with dpkg-deb -x, depmod'ed
#   * a static busybox (busybox-static, downloaded the same way, not installed)
#   * a small gzip'd newc initramfs (scripts/vm/initramfs-init + 9p/overlay modules)
# all under $OVERLAY_VM_CACHE (default /var/cache/overlay-plugin-vm as root).
# Prints NAME=VALUE lines (the paths it produced) on stdout; progress goes to stderr.
#
# Env: OVERLAY_VM_CACHE   cache directory
#      OVERLAY_VM_KVER    kernel version to use, e.g. 6.1.0-57-amd64 (default: the
#                         one already cached, else what linux-image-amd64 names)
#      OVERLAY_VM_REFRESH=1  re-resolve the kernel version through apt even if one is cached
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CACHE=$OVERLAY_VM_CACHE
INITRD_MODULES=(virtio_pci 9pnet_virtio 9p overlay virtio_rng)

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 1200 9 || vm_die "could not lock $CACHE/.lock"

APT_UPDATED=0
apt_update_once() {
	[[ $APT_UPDATED -eq 0 ]] || return 0
	APT_UPDATED=1
	vm_log "apt-get update"
	apt-get update -o DPkg::Lock::Timeout=400 >&2 ||
		vm_log "warning: apt-get update failed (continuing with the lists we have)"
}

apt_install() {
	[[ $(id -u) -eq 0 ]] || vm_die "missing host packages ($*); run as root to install them"
	apt_update_once
	vm_log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=400 \
		--no-install-recommends "$@" >&2
}

# apt_download DIR PKG: fetch PKG's .deb into DIR (updating the lists once if needed).
apt_download() {
	local dir=$1 pkg=$2
	if ! (cd "$dir" && apt-get download -o APT::Sandbox::User=root "$pkg" >&2); then
		[[ $APT_UPDATED -eq 0 ]] || return 1
		apt_update_once
		(cd "$dir" && apt-get download -o APT::Sandbox::User=root "$pkg" >&2)
	fi
}

# extract_vmlinux BZIMAGE OUT: the xz-compressed ELF payload of an x86 bzImage.
extract_vmlinux() {
	local off
	rm -f "$2"
	# shellcheck disable=SC2013 # byte offsets, one word each
	for off in $(LC_ALL=C grep -obUaP '\xfd\x37\x7a\x58\x5a\x00' "$1" | cut -d: -f1); do
		# tail dies of SIGPIPE when xz stops at the end of the stream: only xz's status counts.
		{ tail -c +$((off + 1)) "$1" || true; } | xz -dc --single-stream >"$2" 2>/dev/null || continue
		if [[ $(head -c 4 "$2" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]; then
			return 0
		fi
	done
	rm -f "$2"
	return 1
}

# --- 1. host packages ---------------------------------------------------------
declare -A want=(
	[qemu-system-x86_64]=qemu-system-x86
	[cpio]=cpio
	[depmod]=kmod
	[modprobe]=kmod
	[ip]=iproute2
	[gzip]=gzip
	[flock]=util-linux
	[dpkg-deb]=dpkg
	[xz]=xz-utils
	[ping]=iputils-ping # used by smoke.sh inside the guest
)
missing=()
for cmd in "${!want[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
# qemu's firmware (seabios) comes as a dependency; check it anyway.
[[ -e /usr/share/seabios/bios-256k.bin ]] || missing+=(seabios)
if ((${#missing[@]})); then
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	apt_install "${missing[@]}"
fi

# --- 2. kernel ------------------------------------------------------------------
KVER=${OVERLAY_VM_KVER:-}
if [[ -z $KVER && ${OVERLAY_VM_REFRESH:-0} != 1 && -f $CACHE/kernel/current ]]; then
	KVER=$(<"$CACHE/kernel/current")
	[[ -f $CACHE/kernel/$KVER/.complete ]] || KVER=
fi
if [[ -z $KVER ]]; then
	resolve() { apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: *linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1; }
	KVER=$(resolve)
	if [[ -z $KVER ]]; then
		apt_update_once
		KVER=$(resolve)
	fi
	[[ -n $KVER ]] || vm_die "cannot resolve the kernel linux-image-amd64 depends on"
fi
KDIR=$CACHE/kernel/$KVER
if [[ ! -f $KDIR/.complete ]]; then
	vm_log "fetching linux-image-$KVER"
	rm -rf "$KDIR.tmp"
	mkdir -p "$KDIR.tmp/deb"
	apt_download "$KDIR.tmp/deb" "linux-image-$KVER" || vm_die "apt-get download linux-image-$KVER failed"
	vm_log "unpacking linux-image-$KVER"
	dpkg-deb -x "$KDIR.tmp/deb/linux-image-${KVER}_"*.deb "$KDIR.tmp/root"
	rm -rf "$KDIR.tmp/deb"
	[[ -f $KDIR.tmp/root/boot/vmlinuz-$KVER ]] || vm_die "package has no boot/vmlinuz-$KVER"
	vm_log "depmod -b $KDIR.tmp/root $KVER"
	depmod -b "$KDIR.tmp/root" "$KVER"
	touch "$KDIR.tmp/.complete"
	rm -rf "$KDIR"
	mv "$KDIR.tmp" "$KDIR"
fi
printf '%s\n' "$KVER" >"$CACHE/kernel/current"
# Booting the bzImage spends ~3 s of emulated CPU decompressing it: when the kernel
# has PVH support, keep the uncompressed ELF vmlinux, which qemu boots directly.
if [[ ! -f $KDIR/vmlinux && ! -f $KDIR/.no-vmlinux ]]; then
	if grep -qx CONFIG_PVH=y "$KDIR/root/boot/config-$KVER" &&
		extract_vmlinux "$KDIR/root/boot/vmlinuz-$KVER" "$KDIR/vmlinux.tmp"; then
		mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
	else
		vm_log "note: no PVH vmlinux; booting the compressed bzImage"
		touch "$KDIR/.no-vmlinux"
	fi
fi
KERNEL=$KDIR/root/boot/vmlinuz-$KVER
[[ -f $KDIR/vmlinux ]] && KERNEL=$KDIR/vmlinux
MODROOT=$KDIR/root
MODDIR=$MODROOT/lib/modules/$KVER
[[ -f $MODDIR/modules.dep.bin ]] || vm_die "$MODDIR has no modules.dep.bin"

# --- 3. static busybox ----------------------------------------------------------
BBDIR=$CACHE/busybox
BUSYBOX=$BBDIR/busybox
if [[ ! -f $BBDIR/.complete ]]; then
	vm_log "fetching busybox-static"
	rm -rf "$BBDIR.tmp"
	mkdir -p "$BBDIR.tmp/deb"
	apt_download "$BBDIR.tmp/deb" busybox-static || vm_die "apt-get download busybox-static failed"
	dpkg-deb -x "$BBDIR.tmp"/deb/busybox-static_*.deb "$BBDIR.tmp/root"
	install -m 0755 "$BBDIR.tmp/root/bin/busybox" "$BBDIR.tmp/busybox"
	rm -rf "$BBDIR.tmp/deb" "$BBDIR.tmp/root"
	"$BBDIR.tmp/busybox" true || vm_die "downloaded busybox does not run"
	touch "$BBDIR.tmp/.complete"
	rm -rf "$BBDIR"
	mv "$BBDIR.tmp" "$BBDIR"
fi

# --- 4. initramfs ----------------------------------------------------------------
mods=()
while read -r verb path _; do
	[[ $verb == insmod ]] || continue
	path=$(realpath -m "$path")
	[[ " ${mods[*]-} " == *" $path "* ]] || mods+=("$path")
done < <(for m in "${INITRD_MODULES[@]}"; do
	modprobe -d "$MODROOT" -S "$KVER" --show-depends "$m"
done)
((${#mods[@]} >= ${#INITRD_MODULES[@]})) || vm_die "modules ${INITRD_MODULES[*]} not all found in $MODDIR"
INIT_SRC=$VM_DIR/initramfs-init
INITRD=$CACHE/initrd-$KVER.img
key=$( {
	echo "v1 $KVER $MODDIR $BUSYBOX"
	printf '%s\n' "${mods[@]}"
	sha256sum "$INIT_SRC" "$BUSYBOX" | cut -d' ' -f1
} | sha256sum | cut -d' ' -f1)
if [[ ! -f $INITRD || ! -f $INITRD.key || $(<"$INITRD.key") != "$key" ]]; then
	vm_log "building $INITRD"
	stage=$(mktemp -d "$CACHE/initrd.stage.XXXXXX")
	trap 'rm -rf "$stage"' EXIT
	mkdir -p "$stage"/{bin,dev,proc,sys,lower,rw,newroot,modules}
	install -m 0755 "$BUSYBOX" "$stage/bin/busybox"
	for applet in sh mount insmod mkdir poweroff sleep cat switch_root; do
		ln -s busybox "$stage/bin/$applet"
	done
	mknod -m 0600 "$stage/dev/console" c 5 1 2>/dev/null || true
	mknod -m 0666 "$stage/dev/null" c 1 3 2>/dev/null || true
	i=10
	for m in "${mods[@]}"; do
		cp "$m" "$stage/modules/$i-$(basename "$m")"
		i=$((i + 1))
	done
	install -m 0755 "$INIT_SRC" "$stage/init"
	printf 'KVER=%q\nMODDIR=%q\nBUSYBOX=%q\n' "$KVER" "$MODDIR" "$BUSYBOX" >"$stage/vm.conf"
	(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
		cpio --null --create --format=newc --reproducible --quiet) | gzip -9n >"$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
	printf '%s\n' "$key" >"$INITRD.key"
	rm -rf "$stage"
	trap - EXIT
fi

cat <<OUT
OVERLAY_VM_CACHE=$CACHE
OVERLAY_VM_KVER=$KVER
OVERLAY_VM_KERNEL=$KERNEL
OVERLAY_VM_INITRD=$INITRD
OVERLAY_VM_MODULES=$MODDIR
OVERLAY_VM_BUSYBOX=$BUSYBOX
OUT
