#!/usr/bin/env bash
# plugin/build.sh [OUT_DIR]
#
# Builds the managed (v2) Docker plugin directory, default build/plugin/:
#   OUT_DIR/config.json          plugin/config.json (Docker plugin config v1)
#   OUT_DIR/rootfs/overlay-plugin the static binary
#   OUT_DIR/rootfs/{run/docker/plugins,run/overlay-plugin,run/propagated,
#                   var/lib/overlay-plugin,etc/overlay-plugin,tmp,proc,sys,dev}
# No image and no registry: `docker plugin create NAME OUT_DIR` takes it as is
# (plugin/install.sh does that).
#
# Environment:
#   OVERLAY_PLUGIN_BIN  binary to package (default bin/overlay-plugin; built
#                       with `go build` when missing, or always with REBUILD=1)
#   VERSION             stamped into the binary when it is built here
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
		-ldflags "-s -w -X main.version=${VERSION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo dev)}" \
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
for d in run/docker/plugins run/overlay-plugin run/propagated var/lib/overlay-plugin etc/overlay-plugin tmp proc sys dev; do
	mkdir -p "$out/rootfs/$d"
done
chmod 1777 "$out/rootfs/tmp"
install -m 0755 "$bin" "$out/rootfs/overlay-plugin"
cp "$root/plugin/config.json" "$out/config.json"
if command -v jq >/dev/null; then
	jq -e '.entrypoint and .interface.socket' "$out/config.json" >/dev/null || die "plugin/config.json is not valid"
fi
log "plugin directory ready: $out ($(du -sh "$out" | cut -f1))"
