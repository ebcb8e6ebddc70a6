#!/usr/bin/env bash
# scripts/e2e-docker.sh: end-to-end test of the plugin with real Docker on this
# machine. Run as root on Debian 12: bash scripts/e2e-docker.sh
#
# It installs what it needs from Debian (docker.io, containerd, runc, iptables,
# busybox-static, iproute2), builds the plugin (make build) and
# its directory (plugin/build.sh), starts a 2-node swarm with one dockerd per
# network namespace (scripts/e2e/lib.sh), proves the harness with Docker's own
# overlay, installs the plugin on every node with the README's install command
# and name (make plugin-install PLUGIN_NAME=..., read from README.md) and runs
# the checks of scripts/e2e/checks.sh, the README's own Docker commands first.
# Before all of that, on the still fresh engines (no container run, no plugin
# installed), the rolling upgrade from the previous release through a
# registry of the run's own (check_upgrade, scripts/e2e/upgrade.sh).
# It prints PASS/FAIL per check and ends with
#   e2e: N passed, M failed
# exits non-zero on any failure, and always cleans up (namespaces, daemons,
# mounts, temporary files). Nothing is added to the root network namespace.
#
# Environment: E2E_NODES (2), E2E_CHECKS (subset of check functions),
# E2E_EXPECT_ESP (auto-detected), E2E_KEEP_TMP=1 (keep logs), E2E_SELFTEST=0
# (no harness self-test with Docker's own overlay: the test VM's layer),
# E2E_SKIP_BUILD=1 (use build/plugin and build/plugin-<previous release> as
# they are, build/plugin installed by plugin/install.sh under the README's
# name), E2E_PLUGIN_SETTINGS (extra `docker plugin set` K=V).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -n ${E2E_EXPECT_ESP:-} ]] && E2E_EXPECT_ESP_SET=1
# shellcheck source=scripts/e2e/lib.sh
source "$here/e2e/lib.sh"
# shellcheck source=scripts/e2e/checks.sh
source "$here/e2e/checks.sh"
# shellcheck source=scripts/e2e/upgrade.sh
source "$here/e2e/upgrade.sh"

# The plugin's name is the README's: the checks run the README's commands.
E2E_PLUGIN=$(ck_readme_plugin_name) || die "README.md names no plugin: no 'make plugin-install' in '$CK_README_SECTION', no --alias in Install"
[[ -d /usr/local/go/bin ]] && PATH=$PATH:/usr/local/go/bin

trap e2e_cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

T0=$SECONDS
phase() { log "==== $* (t=$((SECONDS - T0))s)"; }

# e2e_on_fail CHECK: the plugin's and the daemons' recent lines, and the
# plugin's own view of its state (its admin socket, in the node's
# /var/lib/overlay-plugin).
e2e_on_fail() {
	local i dir
	local -a hx
	for ((i = 0; i < E2E_NODES; i++)); do
		dir=$(e2e_node_dir "$i")
		log "---- $(e2e_node_name "$i"): last plugin log lines ----"
		e2e_plugin_log "$i" 40 | sed 's/^/    | /' >&2
		log "---- $(e2e_node_name "$i"): last dockerd errors/warnings ----"
		grep -vE 'plugin=[0-9a-f]{64}' "$dir/dockerd.log" | grep -E 'level=(error|warning)' | tail -n 15 | sed 's/^/    | /' >&2
		if [[ -x $E2E_ROOT/bin/overlay-plugin ]] && e2e_hx "$i" test -S /var/lib/overlay-plugin/admin.sock 2>/dev/null; then
			log "---- $(e2e_node_name "$i"): overlay-plugin state ----"
			read -ra hx <<<"${E2E_HOSTX[i]}"
			timeout 5 "${hx[@]}" "$E2E_ROOT/bin/overlay-plugin" state --state-dir /var/lib/overlay-plugin 2>&1 | head -60 | sed 's/^/    | /' >&2
		fi
	done
}
E2E_ON_FAIL=e2e_on_fail

# e2e_node_log I: node I's dockerd log (the plugin's stdout and stderr are in it).
e2e_node_log() { cat "$(e2e_node_dir "$1")/dockerd.log"; }
E2E_NODE_LOG=e2e_node_log

# e2e_kernel_has_esp: can an ESP SA with AES-GCM be installed? (tried in a
# namespace of this run, never in the root one)
e2e_kernel_has_esp() {
	ip -n "$E2E_PREFIX-sw" xfrm state add src 198.51.100.1 dst 198.51.100.2 proto esp spi 0x100 reqid 1 \
		mode transport aead 'rfc4106(gcm(aes))' 0x0102030405060708090a0b0c0d0e0f1011121314 64 >/dev/null 2>&1 || return 1
	ip -n "$E2E_PREFIX-sw" xfrm state flush
}

# e2e_selected CHECK: CHECK is to run (E2E_CHECKS lists it, or is unset).
e2e_selected() { [[ -z ${E2E_CHECKS:-} || " $E2E_CHECKS " == *" $1 "* ]]; }

# e2e_upgrade_phase: check_upgrade on the fresh engines, with both releases
# in the run's registry; the registry goes again afterwards, and so does
# anything of the plugin the check left (the next phase installs this
# tree's under the README's name).
e2e_upgrade_phase() {
	local rc i pl
	if ! e2e_registry_start; then
		E2E_FAILED=$((E2E_FAILED + 1))
		E2E_RESULTS+=("FAIL: upgrade: the registry did not start (see the log above)")
		echo "${E2E_RESULTS[-1]}"
		return
	fi
	e2e_upgrade_publish
	rc=$?
	if ((rc == 0)); then
		e2e_run_check upgrade check_upgrade "${E2E_DOCKER[@]}"
	else
		E2E_FAILED=$((E2E_FAILED + 1))
		if ((rc == 2)); then
			E2E_RESULTS+=("FAIL: upgrade: the repository's history lacks $E2E_UPGRADE_FROM_COMMIT (release $E2E_UPGRADE_FROM): clone it fully")
		else
			E2E_RESULTS+=("FAIL: upgrade: the releases could not be built or pushed to the registry (see the log above)")
		fi
		echo "${E2E_RESULTS[-1]}"
	fi
	for ((i = 0; i < E2E_NODES; i++)); do
		for pl in $(e2e_dkt 10 "$i" plugin ls -q 2>/dev/null); do
			log "$(e2e_node_name "$i"): removing plugin $pl left by the upgrade phase"
			e2e_dkt 60 "$i" plugin rm -f "$pl" >/dev/null 2>&1
		done
		e2e_hx "$i" sh -c 'rm -rf /var/lib/overlay-plugin/* /run/overlay-plugin/netns' 2>/dev/null
	done
	e2e_registry_stop
}

main() {
	local i
	phase "setup: packages, namespaces, dockerd x$E2E_NODES, swarm, image"
	e2e_setup
	if [[ -z ${E2E_EXPECT_ESP_SET:-} ]]; then
		if e2e_kernel_has_esp; then E2E_EXPECT_ESP=1; else E2E_EXPECT_ESP=0; fi
	fi
	log "kernel ESP support: $( ((E2E_EXPECT_ESP)) && echo yes || echo no) (E2E_EXPECT_ESP=$E2E_EXPECT_ESP)"
	if e2e_selected check_upgrade; then
		phase "rolling upgrade $E2E_UPGRADE_FROM -> $(e2e_upgrade_to || echo '?') from a registry, on the fresh engines"
		e2e_upgrade_phase
	fi
	# The other checks, E2E_CHECKS' or all.
	local -a rest
	read -ra rest <<<"${E2E_CHECKS:-${E2E_PLUGIN_CHECKS[*]}}"
	for ((i = ${#rest[@]} - 1; i >= 0; i--)); do [[ ${rest[i]} != check_upgrade ]] || unset 'rest[i]'; done
	if ((${#rest[@]} == 0)); then
		phase "cleanup"
		e2e_finish
		return
	fi

	if [[ ${E2E_SELFTEST:-1} == 1 ]]; then
		phase "harness self-test with Docker's built-in overlay"
		# Its assertions are Go's too, and come before the plugin's build.
		[[ ${E2E_SKIP_BUILD:-0} == 1 ]] || e2e_build_gotest || log "the Go checks' binary did not build"
		e2e_run_check builtin_overlay check_builtin_overlay "${E2E_DOCKER[@]}"
	else
		log "harness self-test with Docker's built-in overlay: not run (E2E_SELFTEST=0), not counted"
	fi

	phase "plugin: build and install as $E2E_PLUGIN"
	local installed=1
	if ! e2e_build_plugin; then
		installed=0
	elif log "installing build/plugin"
		! e2e_install_plugin "$E2E_PLUGIN"; then
		installed=0
		e2e_dump_logs 20
	fi
	if ((installed)); then
		for ((i = 0; i < E2E_NODES; i++)); do
			log "$(e2e_node_name "$i"): $(e2e_dk "$i" plugin ls --format '{{.Name}} enabled={{.Enabled}}')"
		done
	else
		E2E_FAILED=$((E2E_FAILED + 1))
		E2E_RESULTS+=("FAIL: plugin_install: the plugin could not be built or enabled (see the log above)")
		echo "${E2E_RESULTS[-1]}"
	fi

	phase "plugin checks"
	E2E_CHECKS="${rest[*]}" e2e_plugin_checks "${E2E_DOCKER[@]}"

	phase "cleanup"
	e2e_finish
}

# e2e_finish: cleanup, its own check, the summary.
e2e_finish() {
	e2e_cleanup
	if e2e_check_clean; then
		E2E_PASSED=$((E2E_PASSED + 1)); E2E_RESULTS+=("PASS: harness_cleanup")
	else
		E2E_FAILED=$((E2E_FAILED + 1)); E2E_RESULTS+=("FAIL: harness_cleanup: something was left behind")
	fi
	log "total time $((SECONDS - T0))s"
	e2e_summary
}

main "$@"
