#!/usr/bin/env bash
# scripts/vagrant/build-box.sh: build a debian/bookworm64-compatible libvirt
# box from Debian's packages alone (no box download) and `vagrant box add` it.
#
#   VAGRANT_BOX_NAME  box name to add (default: overlay/bookworm64)
#   VAGRANT_BOX_DIR   work/cache directory (default: /var/cache/overlay-plugin-vagrant)
#   VAGRANT_BOX_SIZE  disk size (default: 8G)
#
# The root filesystem is debootstrapped with everything provisioning needs
# (docker.io, containerd, runc, ...) so `vagrant up` needs no network. The disk
# is one ext4 filesystem made with `mkfs.ext4 -d` (no loop device, no mount),
# booted by libvirt's direct kernel boot: the box ships vmlinuz/initrd and its
# own Vagrantfile points libvirt at them, so no boot loader is needed.
set -euo pipefail

name=${VAGRANT_BOX_NAME:-overlay/bookworm64}
dir=${VAGRANT_BOX_DIR:-/var/cache/overlay-plugin-vagrant}
size=${VAGRANT_BOX_SIZE:-8G}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf 'build-box: %s\n' "$*" >&2; }

[[ $(id -u) -eq 0 ]] || { log "needs root (debootstrap)"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
need=()
for c in debootstrap:debootstrap qemu-img:qemu-utils mkfs.ext4:e2fsprogs vagrant:vagrant; do
	command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
dpkg -s vagrant-libvirt >/dev/null 2>&1 || need+=(vagrant-libvirt)
if ((${#need[@]})); then
	apt-get update -qq
	apt-get install -y -q -o DPkg::Lock::Timeout=400 --no-install-recommends "${need[@]}"
fi

# The same mirror apt uses here: the only one reachable.
# shellcheck disable=SC2016 # apt-get's own field syntax
mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 2>/dev/null |
	grep -v -e security -e updates | head -n1)
: "${mirror:?no Debian mirror in the apt sources}"

root=$dir/root
pkgs=linux-image-amd64,initramfs-tools,systemd-sysv,udev,dbus,openssh-server,sudo,ifupdown,isc-dhcp-client
pkgs+=,docker.io,containerd,runc,iptables,busybox-static,iproute2,jq,make,git,rsync,ca-certificates,curl,kmod,procps,less
# Debian's kernel enables AppArmor, and dockerd then refuses to start any
# container without apparmor_parser (the upstream box has it: priority standard).
pkgs+=,apparmor
# The checks' capture of the underlay (E2E_WIRE_HUB).
pkgs+=,tcpdump
# The tree is reused while the package list is the same.
if [[ $(cat "$dir/root.done" 2>/dev/null) != "$pkgs" ]]; then
	rm -rf "$root" && mkdir -p "$root"
	log "debootstrap bookworm from $mirror (several minutes)"
	debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "$mirror"
	echo "$pkgs" >"$dir/root.done"
fi
# The box is rebuilt only when its inputs changed (run.sh calls this always).
stamp="$pkgs $(cat "$here/configure-root.sh" "$here/box.Vagrantfile" | sha256sum | cut -c1-16)"
if [[ $(cat "$dir/box.done" 2>/dev/null) == "$stamp" ]] && grep -q "^$name " <<<"$(vagrant box list)"; then
	log "box $name is up to date"; exit 0
fi
bash "$here/configure-root.sh" "$root"

log "disk image ($size, ext4 from the tree)"
box=$dir/box && rm -rf "$box" && mkdir -p "$box"
cp -L "$root/vmlinuz" "$box/vmlinuz" && cp -L "$root/initrd.img" "$box/initrd.img"
rm -f "$dir/disk.raw"
mkfs.ext4 -q -F -L root -d "$root" "$dir/disk.raw" "$size"
qemu-img convert -O qcow2 "$dir/disk.raw" "$box/box.img" && rm -f "$dir/disk.raw"
vsize=$(qemu-img info --output=json "$box/box.img" | sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p')
printf '{"provider":"libvirt","format":"qcow2","virtual_size":%d}\n' $((vsize / 1024 / 1024 / 1024)) >"$box/metadata.json"
cp "$here/box.Vagrantfile" "$box/Vagrantfile"

log "packing and adding box $name"
# Uncompressed: qcow2 is sparse already, and gzip costs minutes on 2 cores.
tar -C "$box" -cf "$dir/box.box" metadata.json Vagrantfile box.img vmlinuz initrd.img
vagrant box add --force --name "$name" --provider libvirt "$dir/box.box"
# vagrant-libvirt reuses an uploaded base volume of the same box version:
# drop the old one (it is uploaded again at the next up).
rm -f /var/lib/libvirt/images/"${name//\//-VAGRANTSLASH-}"_vagrant_box_image_*
echo "$stamp" >"$dir/box.done"
log "done: $name"
