#!/usr/bin/env bash
# plugin/build.sh [OUT_DIR]
#
# Builds the managed (v2) Docker plugin directory, default build/plugin/:
#   OUT_DIR/config.json          plugin/config.json (Docker plugin config v1)
#   OUT_DIR/rootfs/overlay-plugin the static binary
#   OUT_DIR/rootfs/{run/docker/plugins,run/propagated,host/run,host/var/lib,
#                   etc/overlay-plugin,tmp,proc,sys,dev}
#   OUT_DIR/rootfs/run/overlay-plugin     -> /host/run/overlay-plugin
#   OUT_DIR/rootfs/run/docker-netns       -> /host/run/docker/netns
#   OUT_DIR/rootfs/var/lib/overlay-plugin -> /host/var/lib/overlay-plugin
# The links keep the settings' default paths (the env values a node upgraded
# from 0.1.0 keeps) pointing at the host, through the 'run' and 'var-lib'
# mounts of parents that exist from boot; the plugin creates their targets.
# No image and no registry: `docker plugin create NAME OUT_DIR` takes it as is
# (plugin/install.sh does that).
#
# Environment:
#   OVERLAY_PLUGIN_BIN  binary to package (default bin/overlay-plugin; built
#                       with `go build` when missing, or always with REBUILD=1)
#   VERSION, COMMIT     stamped into the binary when it is built here
#                       (default: the VERSION file and git's HEAD)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/build/plugin}
bin=${OVERLAY_PLUGIN_BIN:-$root/bin/overlay-plugin}

log() { printf '%s [plugin/build] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ ! -x $bin || ${REBUILD:-0} == 1 ]]; then
	command -v go >/dev/null || die "$bin is missing and go is not installed (run make build first)"
	log "building $bin"
	(cd "$root" && CGO_ENABLED=0 GOEXPERIMENT=runtimesecret go build -trimpath \
		-ldflags "-s -w -X main.version=${VERSION:-$(cat "$root/VERSION")} -X main.commit=${COMMIT:-$(git -C "$root" describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null || echo unknown)}" \
		-o "$bin" ./cmd/overlay-plugin)
fi
[[ -x $bin ]] || die "$bin is not an executable"
# The rootfs has no libc: the binary must be static.
if command -v readelf >/dev/null && grep -q 'program interpreter' <<<"$(readelf -l "$bin" 2>/dev/null)"; then
	die "$bin is dynamically linked; build it with CGO_ENABLED=0"
fi

# Forward secrecy of encrypted networks needs runtime/secret (see
# encryption/erase.go); never ship a binary built without it.
if command -v go >/dev/null && ! grep -q 'GOEXPERIMENT=.*runtimesecret' <<<"$(go version -m "$bin")"; then
	die "$bin was built without GOEXPERIMENT=runtimesecret (make build sets it)"
fi

case $out in /|"") die "refusing OUT_DIR '$out'" ;; esac
rm -rf "$out"
mkdir -p "$out/rootfs"
for d in run/docker/plugins run/propagated host/run host/var/lib var/lib etc/overlay-plugin tmp proc sys dev; do
	mkdir -p "$out/rootfs/$d"
done
ln -s /host/run/overlay-plugin "$out/rootfs/run/overlay-plugin"
ln -s /host/run/docker/netns "$out/rootfs/run/docker-netns"
ln -s /host/var/lib/overlay-plugin "$out/rootfs/var/lib/overlay-plugin"
chmod 1777 "$out/rootfs/tmp"
install -m 0755 "$bin" "$out/rootfs/overlay-plugin"
cp "$root/plugin/config.json" "$out/config.json"
if command -v jq >/dev/null; then
	jq -e '.entrypoint and .interface.socket' "$out/config.json" >/dev/null || die "plugin/config.json is not valid"
fi
log "plugin directory ready: $out ($(du -sh "$out" | cut -f1))"
