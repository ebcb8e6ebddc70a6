#!/usr/bin/env bash
# scripts/vagrant/configure-root.sh ROOT: turn a debootstrapped tree into what
# Vagrant expects of a debian/bookworm64 box: the vagrant user with the
# insecure key (Vagrant swaps it for a fresh one at first `up`), passwordless
# sudo, sshd with per-VM host keys, DHCP on eth0, an empty machine-id.
# Idempotent: build-box.sh runs it on every build.
set -euo pipefail
root=${1:?usage: configure-root.sh ROOT}
pubs=(/usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub)
pub=${pubs[0]}
[[ -f $pub ]] || { echo "configure-root: vagrant's insecure key not found" >&2; exit 1; }

echo bookworm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 bookworm\n' >"$root/etc/hosts"
echo 'LABEL=root / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
# net.ifnames=0 on the command line keeps the name eth0, as the upstream box.
printf 'auto lo\niface lo inet loopback\n\nauto eth0\niface eth0 inet dhcp\n' >"$root/etc/network/interfaces"
# The plugin's ESP path and VXLAN, loaded at boot.
printf '%s\n' esp4 esp6 xfrm_user xfrm_algo vxlan >"$root/etc/modules-load.d/overlay-e2e.conf"

chroot "$root" sh -eu -c '
	id vagrant >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo vagrant
	echo vagrant:vagrant | chpasswd
	systemctl enable ssh docker containerd
	apt-get clean
'
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' >"$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
install -d -m 700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
install -m 600 -o 1000 -g 1000 "$pub" "$root/home/vagrant/.ssh/authorized_keys"
printf 'UseDNS no\n' >"$root/etc/ssh/sshd_config.d/vagrant.conf"

# Host keys made at first boot, so the VMs do not share the build's.
rm -f "$root"/etc/ssh/ssh_host_*
cat >"$root/etc/systemd/system/ssh-hostkeys.service" <<'UNIT'
[Unit]
Description=Generate ssh host keys at first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=multi-user.target
UNIT
ln -sf ../ssh-hostkeys.service "$root/etc/systemd/system/multi-user.target.wants/ssh-hostkeys.service"
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
