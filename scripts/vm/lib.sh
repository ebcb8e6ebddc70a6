# shellcheck shell=bash
# Shared settings for scripts/vm/*.sh. Sourced, not executed.

# Cache directory: kernel package unpacked, busybox, initramfs.
if [[ -z "${OVERLAY_VM_CACHE:-}" ]]; then
	if [[ $(id -u) -eq 0 ]]; then
		OVERLAY_VM_CACHE=/var/cache/overlay-plugin-vm
	else
		OVERLAY_VM_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/overlay-plugin-vm
	fi
fi
OVERLAY_VM_CACHE=${OVERLAY_VM_CACHE%/}

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck disable=SC2034 # used by the scripts that source this
VM_REPO_ROOT=$(cd "$VM_DIR/../.." && pwd -P)

vm_log() { printf 'vm: %s\n' "$*" >&2; }
vm_die() { printf 'vm: error: %s\n' "$*" >&2; exit 1; }
