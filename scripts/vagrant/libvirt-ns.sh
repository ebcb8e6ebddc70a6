#!/usr/bin/env bash
# scripts/vagrant/libvirt-ns.sh start|stop|exec CMD...: a libvirtd of our own
# inside the network namespace ovvagrant, so the bridges, dnsmasq and iptables
# NAT rules that libvirt and vagrant-libvirt create never touch this machine's
# root namespace. `exec` runs CMD (e.g. vagrant) in that namespace, where it can
# reach the VMs' management addresses.
#
# Our qemu.conf is bind-mounted over the system one inside the namespace's
# private mount table (ip netns exec gives one): qemu runs as root (the box's
# kernel lives under root's ~/.vagrant.d), without cgroups, mount namespaces,
# virtlogd or a security driver, none of which this container-like host has.
set -euo pipefail
ns=${VAGRANT_NETNS:-ovvagrant}
state=/run/overlay-plugin-vagrant
pidf=$state/libvirtd.pid
log() { printf 'libvirt-ns: %s\n' "$*" >&2; }

running() { [[ -s $pidf ]] && kill -0 "$(cat "$pidf")" 2>/dev/null; }

start() {
	if running; then log "libvirtd already running (pid $(cat "$pidf"))"; return; fi
	command -v libvirtd >/dev/null || {
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=400 \
			--no-install-recommends libvirt-daemon-system libvirt-clients qemu-system-x86 dnsmasq-base
	}
	mkdir -p "$state"
	grep -qx "$ns\( .*\)\?" <<<"$(ip netns list)" || ip netns add "$ns"
	ip -n "$ns" link set lo up
	cat >"$state/qemu.conf" <<'CONF'
user = "root"
group = "root"
namespaces = [ ]
cgroup_controllers = [ ]
stdio_handler = "file"
security_driver = "none"
remember_owner = 0
CONF
	# shellcheck disable=SC2016 # expanded by the namespace's sh
	ip netns exec "$ns" sh -c 'mount --bind "$1" /etc/libvirt/qemu.conf && exec libvirtd --daemon --pid-file "$2"' \
		sh "$state/qemu.conf" "$pidf"
	local up=0
	for _ in $(seq 50); do
		virsh -c qemu:///system version >/dev/null 2>&1 && { up=1; break; }
		sleep 0.2
	done
	((up)) || { log "libvirtd did not answer"; exit 1; }
	log "libvirtd up (pid $(cat "$pidf")) in netns $ns"
	underlay
}

# underlay: the VMs' private network (192.168.56.0/24, which vagrant-libvirt
# finds by address and uses), made here as a hub: with ageing_time 0 the
# bridge learns no address and floods every frame to every VM, so the VM
# running the checks can capture all nodes' underlay traffic, as an
# eavesdropper on a shared segment would (E2E_WIRE_HUB in the Vagrantfile).
underlay() {
	local net=overlay-underlay br=virbr56
	if ! virsh -q net-info "$net" >/dev/null 2>&1; then
		virsh -q net-define /dev/stdin >/dev/null <<XML
<network><name>$net</name><bridge name='$br' stp='off' delay='0'/>
<ip address='192.168.56.1' netmask='255.255.255.0'/></network>
XML
	fi
	virsh -q net-start "$net" >/dev/null 2>&1 || true
	ip -n "$ns" link set "$br" type bridge ageing_time 0
	log "underlay $net ($br, 192.168.56.0/24) floods every frame"
}

stop() {
	if running; then
		local d n
		# Everything in this libvirtd is ours: domains, then networks.
		for d in $(virsh -q list --name --all 2>/dev/null); do
			virsh -q destroy "$d" >/dev/null 2>&1 || true
			virsh -q undefine --nvram "$d" >/dev/null 2>&1 || virsh -q undefine "$d" >/dev/null 2>&1 || true
		done
		for n in $(virsh -q net-list --name --all 2>/dev/null); do
			virsh -q net-destroy "$n" >/dev/null 2>&1 || true
			[[ $n == default ]] || virsh -q net-undefine "$n" >/dev/null 2>&1 || true
		done
		local pid; pid=$(cat "$pidf")
		kill "$pid"
		for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
		log "libvirtd (pid $pid) stopped"
	fi
	rm -rf "$state"
	if grep -qx "$ns\( .*\)\?" <<<"$(ip netns list)"; then ip netns del "$ns" && log "netns $ns removed"; fi
}

case ${1:-} in
start) start ;;
stop) stop ;;
exec) shift; exec ip netns exec "$ns" "$@" ;;
*) echo "usage: $0 start|stop|exec CMD..." >&2; exit 2 ;;
esac
