#!/usr/bin/env bash
# scripts/e2e/vagrant-run.sh: the Vagrant counterpart of scripts/e2e-docker.sh,
# run as root on the LAST VM (it drives the others over ssh) from the synced
# checkout. Real hosts, real kernels with ESP: encrypted networks must work.
#
#   E2E_NODE_ADDRS  underlay addresses, manager first (e.g. "192.168.56.11 192.168.56.12 192.168.56.13");
#                   the address of this VM is driven locally, the others
#                   through `docker -H ssh://root@ADDR` and `ssh root@ADDR`
#   E2E_PLUGIN      plugin name (default: the README's, which the checks expect)
#   E2E_WIRE_HUB    1: the underlay floods every frame to this VM (the hub
#                   scripts/vagrant/libvirt-ns.sh makes): capture the wire on
#                   this VM's underlay interface; otherwise it goes unwatched
#
# Prints PASS/FAIL per check and "e2e: N passed, M failed"; exits non-zero on
# failure. Leaves the swarm and the plugin in place for inspection
# (`vagrant destroy` is the cleanup).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/e2e/lib.sh
source "$here/lib.sh"
# shellcheck source=scripts/e2e/checks.sh
source "$here/checks.sh"

: "${E2E_PLUGIN:=$(ck_readme_plugin_name)}"
: "${E2E_NODE_ADDRS:?set E2E_NODE_ADDRS}"
export E2E_EXPECT_ESP=1
read -ra addrs <<<"$E2E_NODE_ADDRS"
E2E_NODES=${#addrs[@]}
local_addrs=" $(hostname -I) "

# e2e_sshx USER@HOST CMD...: CMD on another VM, its words quoted for the
# remote shell (E2E_HOSTX entries are word-split and run as CMD prefixes).
e2e_sshx() {
	local h=$1; shift
	ssh -o BatchMode=yes "$h" "$(printf '%q ' "$@")"
}

# The Go checks (test/dockere2e) exec their host prefix: plain ssh, whose
# remote shell gets their words unquoted (none needs quoting).
E2E_DOCKER=() E2E_HOSTX=() E2E_GO_HOSTX=()
for ((i = 0; i < E2E_NODES; i++)); do
	if [[ $local_addrs == *" ${addrs[i]} "* ]]; then
		E2E_DOCKER[i]="docker"
		E2E_HOSTX[i]="env"
	else
		E2E_DOCKER[i]="docker -H ssh://root@${addrs[i]}"
		E2E_HOSTX[i]="e2e_sshx root@${addrs[i]}"
		E2E_GO_HOSTX[i]="ssh -o BatchMode=yes root@${addrs[i]}"
	fi
done
# The Go checks capture in a named namespace: this VM's own, named for the
# run (no address or route is added).
if [[ ${E2E_WIRE_HUB:-0} == 1 ]]; then
	for a in "${addrs[@]}"; do
		[[ $local_addrs == *" $a "* ]] || continue
		E2E_WIRE_IF=$(ip -o addr show to "$a" | awk '{print $2; exit}')
		E2E_WIRE_NETNS=oe-wire$$
		ip netns attach "$E2E_WIRE_NETNS" $$ || die "ip netns attach $E2E_WIRE_NETNS"
	done
fi
e2e_node_log() { e2e_hx "$1" journalctl -u docker --no-pager -o cat --since "-30min"; }
E2E_NODE_LOG=e2e_node_log
e2e_on_fail() {
	local i
	for ((i = 0; i < E2E_NODES; i++)); do
		log "---- ${addrs[i]}: last plugin lines ----"
		e2e_node_log "$i" | grep -E 'plugin=[0-9a-f]{64}' | tail -n 30 | sed 's/^/    | /' >&2
	done
}
E2E_ON_FAIL=e2e_on_fail

# Under TCG (no KVM) every docker call over ssh takes seconds:
# check_disable_enable keeps a plugin disabled for over a minute, and
# traffic to its containers flows for as long as the peers keep its
# endpoints and keys (--dead-grace, 30 s by default; README, Restarts), the
# knob an operator sets above a plugin's expected downtime. As the VM
# layer does (scripts/vm/e2e-docker-guest.sh): 10m, the gossip's tombstone
# TTL, which the grace must not exceed.
E2E_PLUGIN_SETTINGS="OVERLAY_DEAD_GRACE=10m ${E2E_PLUGIN_SETTINGS:-}"

E2E_TMP=$(mktemp -d /tmp/oe.XXXXXX)
trap 'rm -rf "$E2E_TMP"; [[ -z ${E2E_WIRE_NETNS:-} ]] || ip netns del "$E2E_WIRE_NETNS"' EXIT
T0=$SECONDS

# Offline VMs have no Go: the binary built on the host (`make build`,
# rsync'ed with the checkout) is packaged as it is.
if command -v go >/dev/null; then
	log "build: make build, plugin/build.sh"
	make -C "$E2E_ROOT" build >&2 || die "make build failed"
	e2e_build_gotest || die "building test/dockere2e failed"
else
	[[ -x $E2E_ROOT/bin/overlay-plugin ]] || die "no go here and no bin/overlay-plugin: run make build on the host"
	[[ -x $E2E_GO_TEST ]] || die "no go here and no $E2E_GO_TEST: build it on the host (e2e_build_gotest, scripts/e2e/lib.sh)"
	log "build: plugin/build.sh with the host-built bin/overlay-plugin"
fi
bash "$E2E_ROOT/plugin/build.sh" >&2 || die "plugin/build.sh failed"

log "swarm: manager ${addrs[0]}"
if [[ $(e2e_dk 0 info -f '{{.Swarm.LocalNodeState}}') != active ]]; then
	e2e_dk 0 swarm init --advertise-addr "${addrs[0]}" --listen-addr "${addrs[0]}:2377" >/dev/null || die "swarm init"
fi
token=$(e2e_dk 0 swarm join-token -q worker)
for ((i = 1; i < E2E_NODES; i++)); do
	[[ $(e2e_dk "$i" info -f '{{.Swarm.LocalNodeState}}') == active ]] && continue
	e2e_dk "$i" swarm join --token "$token" --advertise-addr "${addrs[i]}" --listen-addr "${addrs[i]}:2377" \
		"${addrs[0]}:2377" >/dev/null || die "swarm join ${addrs[i]}"
done
e2e_wait 60 "swarm nodes Ready" _e2e_nodes_ready || die "swarm did not form"

e2e_build_image
for ((i = 0; i < E2E_NODES; i++)); do
	# The host directories the plugin mounts (the secret was provisioned).
	e2e_hx "$i" mkdir -p /run/overlay-plugin /var/lib/overlay-plugin || die "mkdir on ${addrs[i]}"
	DOCKER="${E2E_DOCKER[i]}" PLUGIN_SETTINGS="OVERLAY_LOG_LEVEL=debug ${E2E_PLUGIN_SETTINGS:-}" \
		bash "$E2E_ROOT/plugin/install.sh" "$E2E_PLUGIN" || die "plugin install on ${addrs[i]}"
done

e2e_run_check builtin_overlay check_builtin_overlay "${E2E_DOCKER[@]}"
e2e_plugin_checks "${E2E_DOCKER[@]}"
log "total time $((SECONDS - T0))s"
e2e_summary
