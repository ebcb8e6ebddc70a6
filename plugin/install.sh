#!/usr/bin/env bash
# plugin/install.sh NAME [DOCKER_HOST]
#
# (Re)installs the plugin directory built by plugin/build.sh on one daemon:
#   docker plugin rm -f NAME; docker plugin create NAME DIR;
#   docker plugin set NAME $PLUGIN_SETTINGS; docker plugin enable NAME
#
# NAME is a plugin reference, NAME:TAG; without a tag it gets :latest, as
# Docker gives it anyway. Docker registers the network driver under that
# full name, so `docker network create -d NAME:TAG` (`-d overlay-plugin`
# fails with "could not resolve driver overlay-plugin in registry" for a
# plugin named overlay-plugin:latest).
#
# Environment:
#   PLUGIN_DIR       plugin directory (default build/plugin)
#   PLUGIN_SETTINGS  space-separated K=V given to `docker plugin set`, e.g.
#                    "OVERLAY_LOG_LEVEL=debug secrets.source=/srv/overlay"
#                    (env names, or <mount>.source for the 'run', 'var-lib',
#                    'secrets' and 'docker' mounts)
#   DOCKER           docker CLI to use (default: docker)
#   PLUGIN_ENABLE_TIMEOUT  seconds for `docker plugin enable` (default 30)
#
# For development: operators install from a registry (README, Install).
# With no DOCKER_HOST (a local daemon), the cluster secret file is checked
# (/etc/overlay-plugin/secret, base64 of 32 random bytes, the SAME on every
# node; the plugin stops at start-up without it unless OVERLAY_SECRET_FILE= is
# set empty), and so is the propagation of the host's /run, which must be
# shared for the per-network namespaces to outlive a plugin stop. The plugin
# creates its own directories (/run/overlay-plugin, /var/lib/overlay-plugin).
set -euo pipefail

name=${1:?usage: plugin/install.sh NAME [DOCKER_HOST]}
[[ -n ${2:-} ]] && export DOCKER_HOST=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${PLUGIN_DIR:-$root/build/plugin}
read -ra docker <<<"${DOCKER:-docker}"

log() { printf '%s [plugin/install %s] %s\n' "$(date -u +%H:%M:%S)" "$name" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The full name, as Docker stores it: a tag after the last path component.
case ${name##*/} in
*@*) die "a plugin name cannot be a digest reference" ;;
*:*) ;;
*) name=$name:latest ;;
esac

[[ -f $dir/config.json && -x $dir/rootfs/overlay-plugin ]] || die "$dir is not a plugin directory (run plugin/build.sh)"

read -ra settings <<<"${PLUGIN_SETTINGS:-}"
if [[ -z ${DOCKER_HOST:-} && " ${docker[*]} " != *" -H "* && " ${docker[*]} " != *" --host"* ]]; then
	src_run=/run src_secrets=/etc/overlay-plugin
	for s in "${settings[@]}"; do
		case $s in
		run.source=*) src_run=${s#*=} ;;
		secrets.source=*) src_secrets=${s#*=} ;;
		esac
	done
	# The namespaces outlive a plugin stop only if the plugin's mounts in
	# them reach the host: the 'run' mount's source must sit on a shared mount
	# (systemd makes every mount shared) other than the one holding Docker's
	# data root, which runc makes private in the plugin's mount namespace.
	run_mount=$(findmnt -n -o TARGET -T "$src_run" 2>/dev/null || true)
	prop=$(findmnt -n -o PROPAGATION -T "$src_run" 2>/dev/null || true)
	data_root=$("${docker[@]}" info -f '{{.DockerRootDir}}' 2>/dev/null || true)
	why=
	if [[ -n $prop && $prop != shared* ]]; then
		why="is on a $prop mount ($run_mount)"
	elif [[ -n $data_root && -n $run_mount && $(findmnt -n -o TARGET -T "$data_root" 2>/dev/null) == "$run_mount" ]]; then
		why="is on the mount that holds Docker's data root ($run_mount)"
	fi
	if [[ -n $why ]]; then
		log "WARNING: $src_run $why: containers will lose their interface on this plugin's networks when the plugin is disabled"
		log "  fix: make it shared at every boot: mount --make-shared $run_mount"
	fi
	# The plugin stops at start-up when its secret file is missing: say so now.
	secret_file=/etc/overlay-plugin/secret
	for s in "${settings[@]}"; do [[ $s == OVERLAY_SECRET_FILE=* ]] && secret_file=${s#*=}; done
	if [[ $secret_file == /etc/overlay-plugin/* && ! -s $src_secrets/${secret_file#/etc/overlay-plugin/} ]]; then
		die "no cluster secret at $src_secrets/${secret_file#/etc/overlay-plugin/}: create it once and copy it to every node
    (umask 077; head -c 32 /dev/urandom | base64 >$src_secrets/${secret_file#/etc/overlay-plugin/})
or run without one (unauthenticated gossip, no encrypted networks): PLUGIN_SETTINGS=\"OVERLAY_SECRET_FILE=\""
	fi
fi

if "${docker[@]}" plugin inspect "$name" >/dev/null 2>&1; then
	log "removing the installed plugin"
	"${docker[@]}" plugin rm -f "$name" >/dev/null
fi
log "docker plugin create $name $dir"
"${docker[@]}" plugin create "$name" "$dir" >/dev/null
if ((${#settings[@]})); then
	log "docker plugin set $name ${settings[*]}"
	"${docker[@]}" plugin set "$name" "${settings[@]}"
fi
log "docker plugin enable $name"
"${docker[@]}" plugin enable --timeout "${PLUGIN_ENABLE_TIMEOUT:-30}" "$name" >/dev/null
grep -qxF "$name" <<<"$("${docker[@]}" plugin ls --filter "enabled=true" --format '{{.Name}}')" \
	|| die "plugin $name is not enabled"
log "enabled; its network driver is $name: docker network create -d $name ..."
