#!/usr/bin/env bash
# scripts/bench-swarm.sh: make bench's figures on a real Docker swarm
# (docs/benchmarks.md): docker run → reachable from the other node, cold and
# warm, and cross-host TCP throughput, the plugin against Docker's built-in
# overlay driver (and the underlay), interleaved. Root.
#
# It builds the two-dockerd swarm of scripts/e2e/lib.sh (a dockerd per
# network namespace, a switch namespace, swarm init/join, the busybox
# image), installs the plugin on both nodes by the README's command (make
# plugin-install), runs build/bench -figures reach,throughput against it and
# cleans everything up, whatever happened. The figures go to
# $BENCH_OUT/{reach,throughput}.{json,md,png}.
#
# It takes no lock: run it under `flock /tmp/overlay-timing.lock` as make
# bench does (make bench BENCH_PARTS=swarm runs only this).
#
# Environment: BENCH_REPS (3), BENCH_OUT (bench/results), BENCH_ARGS (more
# build/bench flags, e.g. "-swarm-duration 10s -swarm-streams 1,2,4"),
# E2E_PREFIX (obs<pid>: the namespaces obs<pid>-sw, -n1, -n2 and the sockets
# /run/obs<pid>-n<i>.sock; the e2e harness's own runs use oe<pid>),
# E2E_KEEP_TMP=1 (keep the dockerd logs), E2E_SKIP_BUILD=1 (build/plugin as is).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
: "${E2E_PREFIX:=obs$$}"
# The plugin at its shipped level: debug logging would be part of what is timed.
: "${E2E_PLUGIN_LOG_LEVEL:=info}"
# shellcheck source=scripts/e2e/lib.sh
source "$here/e2e/lib.sh"
# shellcheck source=scripts/e2e/checks.sh
source "$here/e2e/checks.sh"
[[ -d /usr/local/go/bin ]] && PATH=$PATH:/usr/local/go/bin

reps=${BENCH_REPS:-3}
out=${BENCH_OUT:-$root/bench/results}
plugin=$(ck_readme_plugin_name) || die "README.md has no 'make plugin-install' command in '$CK_README_SECTION'"

[[ $EUID -eq 0 ]] || die "run as root"
# The run directory under the same prefix (short: see e2e_make_tmp).
E2E_TMP=$(mktemp -d "${TMPDIR:-/tmp}/obs.XXXXXX") || die "mktemp"
chmod 755 "$E2E_TMP"
trap e2e_cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

T0=$SECONDS
log "bench-swarm: prefix $E2E_PREFIX, run directory $E2E_TMP, $reps repetition(s)"
e2e_setup
e2e_build_plugin || die "the plugin could not be built"
e2e_install_plugin "$plugin" || { e2e_dump_logs 20; die "the plugin could not be installed"; }
log "swarm ready with $plugin after $((SECONDS - T0)) s"

bin=$root/build/bench
(cd "$root/bench" && go build -o "$bin" ./cmd/bench) || die "go build ./cmd/bench"
hosts=() nss=() addrs=()
for ((i = 0; i < E2E_NODES; i++)); do
	hosts+=("unix://$(e2e_node_sock "$i")")
	nss+=("/run/netns/$(e2e_node_ns "$i")")
	addrs+=("$(e2e_node_addr "$i")")
done
join() { local IFS=,; echo "$*"; }
# shellcheck disable=SC2086 # BENCH_ARGS: flags, split on purpose
"$bin" -figures reach,throughput -reps "$reps" -out "$out" \
	-swarm-docker "$E2E_DOCKER_CLI" -swarm-plugin "$plugin" -swarm-image "$E2E_IMAGE" \
	-swarm-hosts "$(join "${hosts[@]}")" -swarm-netns "$(join "${nss[@]}")" -swarm-addrs "$(join "${addrs[@]}")" \
	-swarm-wire "/run/netns/$(e2e_switch_ns):$(e2e_switch_port 0)" \
	${BENCH_ARGS:-}
rc=$?
((rc == 0)) || e2e_dump_logs 20

e2e_cleanup
e2e_check_clean || rc=1
log "bench-swarm: $((SECONDS - T0)) s in all, exit $rc"
exit "$rc"
