#!/usr/bin/env bash
# plugin/push.sh REF
#
# Publishes the plugin directory built by plugin/build.sh as REF
# (registry/overlay-plugin:VERSION, what `make plugin-push` passes): a
# managed plugin reaches a registry only through an engine, so it is
# created in one under REF (replacing a plugin of that name there, which must
# not be enabled), pushed, and removed again, leaving the engine as it was.
#
# Environment:
#   PLUGIN_DIR  plugin directory (default build/plugin)
#   DOCKER      docker CLI to use (default: docker), e.g. "docker -H unix:///run/x.sock"
set -euo pipefail

ref=${1:?usage: plugin/push.sh REGISTRY/NAME:TAG}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${PLUGIN_DIR:-$root/build/plugin}
read -ra docker <<<"${DOCKER:-docker}"

log() { printf '%s [plugin/push %s] %s\n' "$(date -u +%H:%M:%S)" "$ref" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ ${ref##*/} == *:* ]] || die "give the tag: REGISTRY/NAME:TAG"
[[ -f $dir/config.json && -x $dir/rootfs/overlay-plugin ]] || die "$dir is not a plugin directory (run plugin/build.sh)"

if "${docker[@]}" plugin inspect "$ref" >/dev/null 2>&1; then
	log "replacing the engine's plugin $ref"
	"${docker[@]}" plugin rm "$ref" >/dev/null || die "cannot remove $ref from the engine (enabled? disable it first)"
fi
"${docker[@]}" plugin create "$ref" "$dir" >/dev/null
trap '"${docker[@]}" plugin rm "$ref" >/dev/null 2>&1 || true' EXIT
log "docker plugin push $ref"
"${docker[@]}" plugin push "$ref" >&2
log "pushed: docker plugin install --grant-all-permissions $ref"
