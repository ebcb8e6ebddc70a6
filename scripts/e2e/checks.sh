# shellcheck shell=bash
# scripts/e2e/checks.sh: the end-to-end checks, shared by scripts/e2e-docker.sh
# (a swarm in network namespaces on one machine) and the Vagrantfile (three
# Debian VMs). Source it; it runs nothing by itself.
#
# A check is named by its function, check_<name>, and takes the docker CLI
# invocation of each node, in order, manager first (each a string that is
# word-split, e.g. "docker -H unix:///run/n1.sock" or "docker -H
# ssh://root@node2"). Most are Go tests now, in test/dockere2e (its doc
# says what each asserts; check_plugin_service is TestCheckPluginService):
#
#   check_builtin_overlay   harness self-test: Docker's own overlay, global dnsrr service
#   check_plugin_service    (a) plugin network, global dnsrr service; metrics; VXLAN in clear on the wire
#   check_plugin_attachable (b) --attachable plugin network used by docker run on every node
#   check_plugin_encrypted  (c) --opt encrypted: refused without ESP; with it, ESP on the
#                           wire, a key rotation under a stream losing nothing, no leftovers
#   check_coexistence       (d) Docker's overlay and a plugin network side by side
#   check_teardown          (e) scale up/down, service rm, network rm leave nothing behind
#   check_disable_enable    (f) docker plugin disable -f / enable with tasks running
#   check_plugin_vip        (h) default-mode (VIP) services, scale 1/0/3, a docker stack deploy
#   check_plugin_datapath   (i) UDP 4789 blocked in the switch: overlay-plugin check on both
#                           nodes names it within 10 s, and is clean within 10 s of the fix
#   check_plugin_logs       (g) dockerd logs the plugin's lines at their level, no stop ERROR,
#                           no worker asked GET /nodes
#
# These stay in bash, with the helpers below: check_readme_docker, README.md's
# "Using it with Docker" commands read from the README and run as written
# (settings, network, service), and check_upgrade (scripts/e2e/upgrade.sh).
#
# Settings (environment):
#   E2E_PLUGIN       plugin (driver) name: the README's, ck_readme_plugin_name (required for plugin checks)
#   E2E_IMAGE        busybox image present on every node               (default local/busybox:1)
#   E2E_HOSTX        bash array: E2E_HOSTX[i] runs a command on node i's host
#                    (root), e.g. "nsenter -t PID -m -n -u --" or "ssh root@node2";
#                    needed by (c) with ESP and (e); E2E_GO_HOSTX[i] replaces it
#                    for the Go checks where it is a shell function
#   E2E_EXPECT_ESP   1: the kernel has ESP and encrypted networks must work;
#                    0: they must fail with an error naming the missing support
#   E2E_TASK_TIMEOUT seconds to wait for tasks (default 90)
#   E2E_TIME_SCALE   factor for the other waits (default 1; the test VM's is larger)
#   E2E_WIRE_NETNS, E2E_WIRE_IF  the namespace every node's underlay traffic
#                    passes and its bridge, where the Go checks capture;
#                    without them they say the wire goes unwatched
#   E2E_ON_FAIL      name of a function called after a failed check (log dumps)
#   E2E_NODE_LOG     name of a function printing node i's dockerd log (with the
#                    plugin's lines), for failure reports
#
# Results: e2e_run_check prints "PASS: name (Ns)" or "FAIL: name (Ns): reason";
# e2e_summary prints "e2e: N passed, M failed" and returns non-zero on failure.
#
# Name resolution: the image's busybox `nslookup NAME 127.0.0.11` asks Docker's
# embedded DNS directly and lists every address; checks resolve names that way
# and connect by address (FIELD-NOTES saw busybox wget segfault on lookups).

: "${E2E_IMAGE:=local/busybox:1}"
: "${E2E_TASK_TIMEOUT:=90}"
: "${E2E_EXPECT_ESP:=0}"
: "${E2E_PLUGIN:=}"
E2E_PASSED=${E2E_PASSED:-0}
E2E_FAILED=${E2E_FAILED:-0}
E2E_RESULTS=()
declare -p E2E_HOSTX >/dev/null 2>&1 || E2E_HOSTX=()

CK_PORT=8080

# ------------------------------------------------------------------ helpers

ck_ts() { date -u +%H:%M:%S.%3N; }
ck_log() { printf '%s [check %s] %s\n' "$(ck_ts)" "${CK_NAME:-?}" "$*" >&2; }

# ck_fail MSG: record why the check fails; returns 1.
ck_fail() {
	ck_log "FAIL: $*"
	[[ -n ${CK_REASON_FILE:-} ]] && printf '%s\n' "$*" >>"$CK_REASON_FILE"
	return 1
}

# ck_nodes CLI...: the nodes of the running check.
ck_nodes() { CK_D=("$@"); CK_N=${#CK_D[@]}; }

# ck_dk I ARGS...: docker on node I (0-based).
ck_dk() {
	local i=$1; shift
	local -a c
	read -ra c <<<"${CK_D[$i]}"
	"${c[@]}" "$@"
}

# ck_hx I CMD...: CMD on node I's host; fails when E2E_HOSTX[I] is unset.
ck_hx() {
	local i=$1; shift
	[[ -n ${E2E_HOSTX[$i]:-} ]] || { ck_log "no E2E_HOSTX[$i]: cannot inspect node $i's host"; return 125; }
	local -a c
	read -ra c <<<"${E2E_HOSTX[$i]}"
	"${c[@]}" "$@"
}

# ck_dkt SECONDS I ARGS...: ck_dk under a time limit.
ck_dkt() {
	local t=$1 i=$2; shift 2
	local -a c
	read -ra c <<<"${CK_D[$i]}"
	timeout "$t" "${c[@]}" "$@"
}

ck_have_hostx() {
	local i
	for ((i = 0; i < CK_N; i++)); do [[ -n ${E2E_HOSTX[$i]:-} ]] || return 1; done
}

# ck_retry SECONDS CMD...: run CMD until it succeeds (output of the last
# try), for SECONDS times E2E_TIME_SCALE.
ck_retry() {
	local limit=$(($1 * ${E2E_TIME_SCALE:-1})); shift
	local end=$((SECONDS + limit)) out rc
	while :; do
		out=$("$@" 2>&1) && rc=0 || rc=$?
		if ((rc == 0)) || ((SECONDS >= end)); then
			printf '%s' "$out"
			return "$rc"
		fi
		sleep 1
	done
}

# Resources a check creates are removed when its subshell exits
# (CK_IMAGES: "node:image" made by the check; CK_PIDS: its background
# processes, a capture or a stream; CK_FILES: its temporary files).
CK_SERVICES=() CK_NETWORKS=() CK_CONTAINERS=() CK_IMAGES=() CK_PIDS=() CK_FILES=()
ck_teardown() {
	local p
	for p in "${CK_PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
	ck_remove
	if ((${#CK_FILES[@]})); then rm -f "${CK_FILES[@]}"; fi
}

# ck_remove: remove the check's services, containers, networks and images
# (and forget them).
ck_remove() {
	local s n c i
	for s in "${CK_SERVICES[@]}"; do ck_dk 0 service rm "$s" >/dev/null 2>&1; done
	for c in "${CK_CONTAINERS[@]}"; do ck_dk "${c%%:*}" rm -f "${c#*:}" >/dev/null 2>&1; done
	if ((${#CK_SERVICES[@]})); then
		for s in "${CK_SERVICES[@]}"; do
			for ((i = 0; i < 60; i++)); do
				[[ -z $(ck_all_task_containers "$s") ]] && break
				sleep 0.5
			done
		done
	fi
	for n in "${CK_NETWORKS[@]}"; do
		for ((i = 0; i < 20; i++)); do
			ck_dk 0 network rm "$n" >/dev/null 2>&1 && break
			ck_dk 0 network inspect "$n" >/dev/null 2>&1 || break
			sleep 1
		done
	done
	for c in "${CK_IMAGES[@]}"; do ck_dk "${c%%:*}" rmi -f "${c#*:}" >/dev/null 2>&1; done
	CK_SERVICES=() CK_NETWORKS=() CK_CONTAINERS=() CK_IMAGES=()
}

# ck_all_task_containers SVC: "node:cid" of SVC's containers on all nodes.
ck_all_task_containers() {
	local i
	for ((i = 0; i < CK_N; i++)); do
		ck_dk "$i" ps -aq -f "label=com.docker.swarm.service.name=$1" 2>/dev/null | sed "s/^/$i:/"
	done
}

# ck_network NAME DRIVER [ARGS...]: docker network create on the manager;
# Docker's error in CK_LAST_ERROR.
ck_network() {
	local name=$1 driver=$2; shift 2
	local out
	out=$(ck_dk 0 network create -d "$driver" --scope swarm "$@" "$name" 2>&1) || {
		ck_log "network create $name failed: $out"
		# shellcheck disable=SC2034 # the caller's (upgrade.sh) to report
		CK_LAST_ERROR=$out
		return 1
	}
	CK_NETWORKS+=("$name")
	ck_log "network $name ($driver $*) = ${out:0:12}"
}

# ck_running_cids I SVC: running task containers of SVC on node I.
ck_running_cids() {
	ck_dk "$1" ps -q -f "label=com.docker.swarm.service.name=$2" -f status=running 2>/dev/null
}

# ck_task_errors SVC: the distinct errors of SVC's tasks.
ck_task_errors() {
	ck_dk 0 service ps --no-trunc --format '{{.Error}}' "$1" 2>/dev/null \
		| grep . | sort | uniq -c | sort -rn | head -3 | sed -E 's/^ *([0-9]+) /\1x /'
}

# ck_failed_tasks SVC: how many of SVC's tasks failed or were rejected.
ck_failed_tasks() {
	ck_dk 0 service ps --format '{{.CurrentState}}' "$1" 2>/dev/null | grep -cE '^(Failed|Rejected)'
}

# ck_node_log I: node I's daemon log with the plugin's lines, through the
# function named by E2E_NODE_LOG (empty when unset).
ck_node_log() {
	[[ -n ${E2E_NODE_LOG:-} ]] && "$E2E_NODE_LOG" "$1"
}

# ck_wait_tasks SVC PER_NODE: wait until every node runs PER_NODE tasks of SVC.
ck_wait_tasks() {
	local svc=$1 want=$2 start=$SECONDS end=$((SECONDS + E2E_TASK_TIMEOUT)) i n ok
	while :; do
		ok=1
		for ((i = 0; i < CK_N; i++)); do
			n=$(ck_running_cids "$i" "$svc" | grep -c .)
			((n == want)) || ok=0
		done
		((ok)) && return 0
		# Tasks failing again and again: no point in waiting any longer.
		if ((SECONDS - start >= 15)) && (($(ck_failed_tasks "$svc") >= 2 * CK_N)); then
			ck_fail "service $svc: tasks keep failing: $(ck_task_errors "$svc" | tr '\n' ';')"
			return 1
		fi
		if ((SECONDS >= end)); then
			ck_log "tasks of $svc after ${E2E_TASK_TIMEOUT}s:"
			ck_dk 0 service ps --no-trunc "$svc" 2>&1 | head -12 | sed 's/^/    | /' >&2
			ck_fail "service $svc: not $want running task(s) on each of $CK_N nodes after ${E2E_TASK_TIMEOUT}s; errors: $(ck_task_errors "$svc" | tr '\n' ';')"
			return 1
		fi
		sleep 1
	done
}

# ck_ip I CID NET: the container's address on NET.
ck_ip() {
	ck_dk "$1" inspect -f "{{with index .NetworkSettings.Networks \"$3\"}}{{.IPAddress}}{{end}}" "$2"
}

# ck_get I CID ADDR: HTTP GET from container CID on node I, retried for
# CK_GET_RETRY seconds.
CK_GET_RETRY=20
ck_get() {
	ck_retry "$CK_GET_RETRY" ck_dk "$1" exec "$2" timeout 5 wget -q -O- "http://$3:$CK_PORT/"
}

# ck_resolve I CID NAME: the addresses Docker's embedded DNS gives for NAME.
ck_resolve() {
	ck_dk "$1" exec "$2" nslookup "$3" 127.0.0.11 2>/dev/null \
		| awk '/^Name:/ {n = 1; next} n && /^Address/ {sub(/^Address:?[ \t]*/, ""); sub(/:53$/, ""); print}' | sort -u
}

# ck_resolve_n I CID NAME MIN: ck_resolve, failing with fewer than MIN addresses.
ck_resolve_n() {
	local r
	r=$(ck_resolve "$1" "$2" "$3")
	printf '%s\n' "$r"
	(($(grep -c . <<<"$r") >= $4))
}

# ------------------------------------------------------------------ README

# The README's commands are run as written, so that the README and what works
# cannot drift apart: the plugin is installed by the README's install command
# under its name (scripts/e2e/lib.sh, e2e_install_plugin), and
# check_readme_docker runs the rest of its "Using it with Docker" section.
CK_README=${CK_README:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/README.md}
CK_README_SECTION="Using it with Docker"

# ck_readme_cmds [SECTION]: the commands of README.md's ```sh blocks, of the
# "## SECTION" part only when given, one a line: continuation lines joined,
# comments and blank lines dropped.
ck_readme_cmds() {
	awk -v sec="${1:-}" '
		BEGIN { in_sec = (sec == "") }
		/^## / { in_sec = (sec == "" || substr($0, 4) == sec); next }
		!in_sec { next }
		/^```sh[ \t]*$/ { in_sh = 1; cont = ""; next }
		/^```/ { in_sh = 0; next }
		!in_sh || /^[ \t]*#/ { next }
		{
			line = $0
			sub(/[ \t]+#.*$/, "", line)
			sub(/^[ \t]+/, "", line)
			if (cont != "") line = cont " " line
			if (line ~ /\\$/) { sub(/[ \t]*\\$/, "", line); cont = line; next }
			cont = ""
			if (line != "") print line
		}' "$CK_README"
}

# ck_readme_registry_install: the README's `docker plugin install` command
# (its Install section: from a registry).
ck_readme_registry_install() {
	ck_readme_cmds Install | grep -m1 -E '^docker plugin install '
}

# ck_readme_install_cmd: the README's development install of the checkout,
# `make plugin-install ...` in "$CK_README_SECTION"; where the README
# installs from a registry instead (its Install section), `make
# plugin-install PLUGIN_NAME=<the name it gives the plugin>`, which the
# README names for development. (Installing from a registry is
# check_upgrade's, scripts/e2e/upgrade.sh.)
ck_readme_install_cmd() {
	local name
	ck_readme_cmds "$CK_README_SECTION" | grep -m1 -E '^make plugin-install( |$)' && return 0
	name=$(ck_readme_alias) || return 1
	echo "make plugin-install PLUGIN_NAME=$name"
}

# ck_readme_alias: the --alias of the README's docker plugin install.
ck_readme_alias() {
	local name
	name=$(ck_readme_registry_install | grep -oE -- '--alias[ =][^ ]+' | sed -E 's/^--alias[ =]//')
	[[ -n $name ]] && echo "$name"
}

# ck_readme_plugin_name: the plugin name the README installs: its install
# command's PLUGIN_NAME (or --alias), else the Makefile's default.
ck_readme_plugin_name() {
	local cmd name
	cmd=$(ck_readme_install_cmd) || return 1
	name=$(grep -oE '(^| )PLUGIN_NAME=[^ ]+' <<<"$cmd" | sed 's/.*=//')
	[[ -n $name ]] || name=$(sed -nE 's/^PLUGIN_NAME[ \t]*\??=[ \t]*([^ \t]+).*/\1/p' "$(dirname "$CK_README")/Makefile")
	[[ -n $name ]] && echo "$name"
}

# ck_readme_names: the plugin names the README gives docker anywhere (in
# code blocks or in the text): `network create -d NAME` and `docker plugin
# disable|enable|set|inspect|rm NAME`.
ck_readme_names() {
	# shellcheck disable=SC2016 # a literal backquote in the pattern
	grep -oE -- '(network create -d|docker plugin (disable|enable|set|inspect|rm)( -f)?) [^- `;\\][^ `;\\]*' "$CK_README" | awk '{print $NF}'
}

# ------------------------------------------------------------------ checks

# check_readme_docker: README.md's "Using it with Docker" commands, read from
# the README and run as written, `docker` being each node's CLI: every plugin
# name the README gives docker is the installed one; the settings commands
# (disable, set, enable) on every node, before any network uses the plugin;
# the example network, and its service, whose tasks must reach each other on
# it by address and through tasks.<service>. Two stand-ins: the service's
# image (the README's last word) is the test image under that name where a
# node lacks it (no registry here), serving HTTP on port 80; and where the
# kernel has no ESP the network is created without --opt encrypted (the
# refusal is check_plugin_encrypted's).
check_readme_docker() {
	ck_nodes "$@"
	local -a cmds settings
	local c i j out net_cmd='' svc_cmd='' net svc image bad
	[[ -f $CK_README ]] || { ck_fail "no README at $CK_README"; return 1; }
	bad=$(ck_readme_names | grep -vxF -- "$E2E_PLUGIN" | sort -u | tr '\n' ' ')
	[[ -z $bad ]] || { ck_fail "the README names the plugin [${bad% }] but it is installed as $E2E_PLUGIN"; return 1; }
	mapfile -t cmds < <(ck_readme_cmds "$CK_README_SECTION")
	for c in "${cmds[@]}"; do
		case $c in
		"docker plugin disable "* | "docker plugin set "* | "docker plugin enable "*) settings+=("$c") ;;
		"docker network create "*) [[ -n $net_cmd ]] || net_cmd=$c ;;
		"docker service create "*) [[ -n $svc_cmd ]] || svc_cmd=$c ;;
		esac
	done
	((${#settings[@]} == 3)) || { ck_fail "README: want docker plugin disable, set and enable, found: ${settings[*]}"; return 1; }
	[[ -n $net_cmd && -n $svc_cmd ]] || { ck_fail "README: no docker network create and docker service create in '$CK_README_SECTION'"; return 1; }
	net=${net_cmd##* } image=${svc_cmd##* }
	svc=$(sed -nE 's/.* --name[ =]([^ ]+).*/\1/p' <<<"$svc_cmd")
	[[ -n $svc ]] || { ck_fail "README: the service create has no --name: $svc_cmd"; return 1; }
	[[ $svc_cmd == *" --mode global "* ]] || { ck_fail "README: the example service is not --mode global (one task per node, for traffic across hosts): $svc_cmd"; return 1; }

	for ((i = 0; i < CK_N; i++)); do
		for c in "${settings[@]}"; do
			out=$(eval "ck_dkt 60 $i ${c#docker }" 2>&1) || { ck_fail "node $i: $c: $out"; return 1; }
		done
		ck_log "node $i: ${#settings[@]} settings commands ok: ${settings[*]}"
	done

	if [[ ${E2E_EXPECT_ESP:-0} != 1 && $net_cmd == *" --opt encrypted"* ]]; then
		net_cmd=${net_cmd/ --opt encrypted/}
		ck_log "note: this kernel has no ESP: the README's network without --opt encrypted"
	fi
	CK_NETWORKS+=("$net")
	out=$(eval "ck_dkt 60 0 ${net_cmd#docker }" 2>&1) || { ck_fail "$net_cmd: $out"; return 1; }
	ck_log "$net_cmd = ${out:0:12}"

	for ((i = 0; i < CK_N; i++)); do
		ck_dk "$i" image inspect "$image" >/dev/null 2>&1 && continue
		c=$(ck_dk "$i" create "$E2E_IMAGE") || { ck_fail "node $i: docker create $E2E_IMAGE failed"; return 1; }
		out=$(ck_dk "$i" commit --change 'CMD ["sh", "-c", "hostname >/www/index.html; exec httpd -f -p 80 -h /www"]' "$c" "$image" 2>&1) \
			|| { ck_dk "$i" rm "$c" >/dev/null 2>&1; ck_fail "node $i: stand-in image $image: $out"; return 1; }
		ck_dk "$i" rm "$c" >/dev/null 2>&1
		CK_IMAGES+=("$i:$image")
	done
	ck_log "image $image on every node (the test image serving HTTP on port 80 where it was missing)"

	# Not detached: the CLI returns once the service converged.
	CK_SERVICES+=("$svc")
	out=$(eval "ck_dkt $E2E_TASK_TIMEOUT 0 ${svc_cmd#docker }" 2>&1) \
		|| { ck_fail "$svc_cmd (${E2E_TASK_TIMEOUT}s): $(tail -3 <<<"$out" | tr '\n' ' ') tasks: $(ck_task_errors "$svc" | tr '\n' ';')"; return 1; }
	ck_log "$svc_cmd: converged"
	ck_wait_tasks "$svc" 1 || return 1

	local CK_PORT=80 fails=0 names
	local -a cid ip
	for ((i = 0; i < CK_N; i++)); do
		cid[i]=$(ck_running_cids "$i" "$svc" | head -1)
		ip[i]=$(ck_ip "$i" "${cid[i]}" "$net")
		[[ -n ${ip[i]} ]] || { ck_fail "node $i: task ${cid[i]:0:12} has no address on $net"; return 1; }
	done
	for ((i = 0; i < CK_N; i++)); do
		for ((j = 0; j < CK_N; j++)); do
			((i == j)) && continue
			if out=$(ck_get "$i" "${cid[i]}" "${ip[j]}") && [[ -n $out ]]; then
				ck_log "node $i -> node $j (${ip[j]}:$CK_PORT on $net): ok"
			else
				ck_fail "node $i -> node $j (${ip[j]}:$CK_PORT on $net): no answer"
				fails=1
			fi
		done
		names=$(ck_retry 15 ck_resolve_n "$i" "${cid[i]}" "tasks.$svc" "$CK_N")
		for ((j = 0; j < CK_N; j++)); do
			grep -qxF -- "${ip[j]}" <<<"$names" && continue
			ck_fail "node $i: tasks.$svc resolves to [$(tr '\n' ' ' <<<"$names")], without ${ip[j]}"
			fails=1
		done
		((fails)) || ck_log "node $i: tasks.$svc -> $(tr '\n' ' ' <<<"$names")"
	done
	# As the README says, its disable refuses while a network uses the plugin.
	c=$(printf '%s\n' "${settings[@]}" | grep -m1 '^docker plugin disable ')
	if out=$(eval "ck_dkt 60 0 ${c#docker }" 2>&1); then
		ck_dk 0 plugin enable "$E2E_PLUGIN" >/dev/null 2>&1
		ck_fail "$c succeeded on node 0 with $net in use; the README says it refuses"
		fails=1
	else
		ck_log "$c with $net in use: refused: $out"
	fi
	return "$fails"
}

# ------------------------------------------------------------------ Go

# The checks ported to Go (test/dockere2e: check_plugin_service is
# TestCheckPluginService, see ck_go_name), run from its test binary E2E_GO_TEST (built
# static by e2e_build_plugin, scripts/e2e/lib.sh) with the swarm named in
# its environment (test/dockere2e/env.go). E2E_GO_HOSTX[i], where set,
# replaces E2E_HOSTX[i] for it: a command to exec, not a shell function.
E2E_GO_CHECKS=(check_builtin_overlay check_plugin_service check_plugin_attachable check_plugin_encrypted
	check_coexistence check_teardown check_disable_enable check_plugin_vip check_plugin_datapath check_plugin_logs)
: "${E2E_GO_TEST:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/e2e/dockere2e.test}"
declare -p E2E_GO_HOSTX >/dev/null 2>&1 || E2E_GO_HOSTX=()

# ck_go_name FUNC: the Go test of check function FUNC (matched without
# regard to case: check_plugin_vip is TestCheckPluginVIP).
ck_go_name() { sed -E 's/(^|_)([a-z])/\U\2/g; s/^/Test/' <<<"$1"; }

# ck_go_check FUNC: run FUNC's Go test; its output goes to the log, the
# line before its verdict is the reason of a failure.
ck_go_check() {
	local test out hostx='' logs='' i rc reason
	test=$(ck_go_name "$1")
	[[ -x $E2E_GO_TEST ]] || { ck_fail "no Go e2e test binary at $E2E_GO_TEST (e2e_build_plugin builds it)"; return 1; }
	out=$(mktemp)
	CK_FILES+=("$out")
	for ((i = 0; i < CK_N; i++)); do
		hostx+="${E2E_GO_HOSTX[i]:-${E2E_HOSTX[i]:-}}"$'\n'
		[[ -n ${E2E_NODE_LOG:-} ]] || continue
		CK_FILES+=("$out.n$i")
		ck_node_log "$i" >"$out.n$i"
		logs+="$out.n$i"$'\n'
	done
	E2E_NODE_DOCKER=$(printf '%s\n' "${CK_D[@]}") E2E_NODE_HOSTX=$hostx E2E_NODE_LOGS=$logs \
		E2E_WIRE_NETNS=${E2E_WIRE_NETNS:-} E2E_WIRE_IF=${E2E_WIRE_IF:-} \
		E2E_PLUGIN_CLI=${E2E_PLUGIN_CLI:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/bin/overlay-plugin} \
		E2E_PLUGIN=$E2E_PLUGIN E2E_IMAGE=$E2E_IMAGE E2E_EXPECT_ESP=$E2E_EXPECT_ESP \
		E2E_TASK_TIMEOUT=$E2E_TASK_TIMEOUT E2E_TIME_SCALE=${E2E_TIME_SCALE:-1} OVERLAY_TEST_REQUIRE=dockere2e \
		"$E2E_GO_TEST" -test.run "(?i)^$test\$" -test.v -test.count=1 -test.timeout 60m 2>&1 | tee "$out" >&2
	rc=${PIPESTATUS[0]}
	grep -qi -- "^--- PASS: $test " "$out" && ((rc == 0)) && return 0
	reason=$(awk '/^--- FAIL/ {print last; exit} /^ +[a-z_]+\.go:[0-9]+: / {sub(/^ +/, ""); last = $0}' "$out" | cut -c1-400)
	ck_fail "$test: ${reason:-did not run or pass (rc=$rc)}"
}

# ------------------------------------------------------------------ runner

# e2e_run_check NAME FUNC CLI...: run one check in a subshell (its resources
# removed at its end) and record PASS/FAIL.
e2e_run_check() {
	local name=$1 fn=$2; shift 2
	local t0=$SECONDS rc reason
	CK_REASON_FILE=$(mktemp)
	printf '%s === RUN   %s\n' "$(ck_ts)" "$name" >&2
	(
		CK_NAME=$name
		ck_nodes "$@"
		trap ck_teardown EXIT
		if [[ " ${E2E_GO_CHECKS[*]} " == *" $fn "* ]]; then ck_go_check "$fn"; else "$fn" "$@"; fi
	) && rc=0 || rc=$?
	reason=$(head -3 "$CK_REASON_FILE" | tr '\n' ';' | sed 's/;$//')
	((${#reason} > 400)) && reason="${reason:0:400}..."
	rm -f "$CK_REASON_FILE"
	if ((rc == 0)); then
		E2E_PASSED=$((E2E_PASSED + 1))
		E2E_RESULTS+=("PASS: $name ($((SECONDS - t0))s)")
	else
		E2E_FAILED=$((E2E_FAILED + 1))
		E2E_RESULTS+=("FAIL: $name ($((SECONDS - t0))s): ${reason:-rc=$rc}")
		[[ -n ${E2E_ON_FAIL:-} ]] && "$E2E_ON_FAIL" "$name"
	fi
	printf '%s\n' "${E2E_RESULTS[-1]}"
	return 0
}

# e2e_plugin_checks CLI...: the README's commands, (a)-(h) against
# $E2E_PLUGIN; E2E_CHECKS may list a subset by function name.
# check_readme_docker comes first: the README's settings commands disable
# the plugin, which Docker refuses while a network uses it.
E2E_PLUGIN_CHECKS=(check_readme_docker check_plugin_service check_plugin_attachable check_plugin_encrypted
	check_coexistence check_teardown check_disable_enable check_plugin_vip check_plugin_datapath check_plugin_logs)
e2e_plugin_checks() {
	local c
	for c in ${E2E_CHECKS:-${E2E_PLUGIN_CHECKS[*]}}; do
		e2e_run_check "${c#check_}" "$c" "$@"
	done
}

e2e_summary() {
	local r
	echo "---- results ----"
	for r in "${E2E_RESULTS[@]}"; do echo "$r"; done
	echo "e2e: $E2E_PASSED passed, $E2E_FAILED failed"
	((E2E_FAILED == 0))
}
