# shellcheck shell=bash
# scripts/e2e/checks.sh: the end-to-end checks, shared by scripts/e2e-docker.sh
# (a swarm in network namespaces on one machine) and the Vagrantfile (three
# Debian VMs). Source it; it runs nothing by itself.
#
# Every check is a function taking the docker CLI invocation of each node, in
# order, manager first (each a string that is word-split, e.g.
# "docker -H unix:///run/n1.sock" or "docker -H ssh://root@node2"):
#
#   check_builtin_overlay  harness self-test: Docker's own overlay, global dnsrr service
#   check_readme_docker    README.md's "Using it with Docker" commands, read from the
#                          README and run as written: settings, network, service
#   check_plugin_service   (a) plugin network, global dnsrr service, by address and tasks.<svc>;
#                          the metrics on each node's admin socket
#   check_plugin_attachable (b) --attachable plugin network used by docker run on every node
#   check_plugin_encrypted (c) --opt encrypted: a clear error without ESP; with it, a
#                          service and containers talking by address and name over ESP,
#                          a forced key rotation under a sequenced stream losing
#                          nothing, no VXLAN of the network in clear on the wire, and
#                          no SA, policy or nft table left once it is removed
#   check_coexistence      (d) Docker's overlay and a plugin network side by side
#   check_teardown         (e) scale up/down, service rm, network rm leave nothing behind
#   check_disable_enable   (f) docker plugin disable -f / enable with tasks running
#                          (on an encrypted network where the kernel has ESP, and
#                          then nothing of it in clear on the wire)
#   check_plugin_logs      (g) dockerd logs the plugin's lines at the plugin's level,
#                          a plugin stop logs no ERROR (closed transport, cancelled dial),
#                          and no worker's dockerd is asked GET /nodes by the plugin
#   check_plugin_vip       (h) default-mode (VIP) services: balanced by name from every
#                          node, scale 1/0/3, no rule left; a docker stack deploy
#
# Settings (environment):
#   E2E_PLUGIN       plugin (driver) name: the README's, ck_readme_plugin_name (required for plugin checks)
#   E2E_IMAGE        busybox image present on every node               (default local/busybox:1)
#   E2E_HOSTX        bash array: E2E_HOSTX[i] runs a command on node i's host
#                    (root), e.g. "nsenter -t PID -m -n -u --" or "ssh root@node2";
#                    needed by (c) with ESP and (e)
#   E2E_EXPECT_ESP   1: the kernel has ESP and encrypted networks must work;
#                    0: they must fail with an error naming the missing support
#   E2E_TASK_TIMEOUT seconds to wait for tasks (default 90)
#   E2E_TIME_SCALE   factor for the other waits (default 1; the test VM's is larger)
#   E2E_WIRE, E2E_WIRE_IF  a command prefix running where every node's underlay
#                    traffic passes, and the interface to capture on there;
#                    without them the checks say the wire goes unwatched
#   E2E_ON_FAIL      name of a function called after a failed check (log dumps)
#   E2E_NODE_LOG     name of a function printing node i's dockerd log (with the
#                    plugin's lines), for failure reports
#
# Results: e2e_run_check prints "PASS: name (Ns)" or "FAIL: name (Ns): reason";
# e2e_summary prints "e2e: N passed, M failed" and returns non-zero on failure.
#
# Name resolution: the image's busybox `nslookup NAME 127.0.0.11` asks Docker's
# embedded DNS directly and lists every address; checks resolve tasks.<svc> that
# way and connect by address. `wget http://tasks.<svc>:8080/` is tried too: it
# works with Debian 12's busybox-static here, but FIELD-NOTES saw busybox wget
# segfault on name lookups, so a crash of that extra probe is reported, not failed.

: "${E2E_IMAGE:=local/busybox:1}"
: "${E2E_TASK_TIMEOUT:=90}"
: "${E2E_EXPECT_ESP:=0}"
: "${E2E_PLUGIN:=}"
E2E_PASSED=${E2E_PASSED:-0}
E2E_FAILED=${E2E_FAILED:-0}
E2E_RESULTS=()
declare -p E2E_HOSTX >/dev/null 2>&1 || E2E_HOSTX=()

# Docker's VNIs start at 4096; the plugin's are 256..4095.
CK_VNI_MIN=256 CK_VNI_MAX=4095
CK_PORT=8080
CK_ESP_RE='ESP|esp4|GCM|gcm|rfc4106|xfrm|IPsec|ipsec'

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

# ck_network NAME DRIVER [ARGS...]: docker network create on the manager.
ck_network() {
	local name=$1 driver=$2; shift 2
	local out
	out=$(ck_dk 0 network create -d "$driver" --scope swarm "$@" "$name" 2>&1) || {
		ck_log "network create $name failed: $out"
		CK_LAST_ERROR=$out
		return 1
	}
	CK_NETWORKS+=("$name")
	ck_log "network $name ($driver $*) = ${out:0:12}"
}

# ck_web_service NAME [service create args...]: a dnsrr service whose tasks
# serve their node's host name over HTTP on $CK_PORT.
ck_web_service() {
	local name=$1; shift
	CK_SERVICES+=("$name")
	local out
	out=$(ck_dk 0 service create -d --name "$name" --no-resolve-image --endpoint-mode dnsrr \
		--hostname '{{.Node.Hostname}}' --stop-grace-period 1s "$@" "$E2E_IMAGE" \
		sh -c "hostname >/www/index.html; exec httpd -f -p $CK_PORT -h /www" 2>&1) || {
		ck_log "service create $name failed: $out"
		CK_LAST_ERROR=$out
		return 1
	}
	ck_log "service $name ($*) = ${out:0:12}"
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
# CK_GET_RETRY seconds (20; ck_mesh lowers it after a first failure).
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

# ck_mesh SVC NET [nodns]: each node's task reaches every other node's task on
# NET by address and through tasks.SVC (not with nodns: for a task on several
# networks the embedded DNS answers with the first network's addresses only).
# One task per node is used.
ck_mesh() {
	local svc=$1 net=$2 dns=${3:-dns} i j body names want got rc
	local CK_GET_RETRY=$CK_GET_RETRY
	local -a cid ip host
	for ((i = 0; i < CK_N; i++)); do
		cid[i]=$(ck_running_cids "$i" "$svc" | head -1)
		[[ -n ${cid[i]} ]] || { ck_fail "no running task of $svc on node $i"; return 1; }
		ip[i]=$(ck_ip "$i" "${cid[i]}" "$net")
		[[ -n ${ip[i]} ]] || { ck_fail "task ${cid[i]:0:12} on node $i has no address on $net"; return 1; }
		host[i]=$(ck_dk "$i" info -f '{{.Name}}')
	done
	ck_log "tasks on $net: $(for ((i = 0; i < CK_N; i++)); do printf '%s=%s ' "${host[i]}" "${ip[i]}"; done)"
	local fails=0
	for ((i = 0; i < CK_N; i++)); do
		for ((j = 0; j < CK_N; j++)); do
			((i == j)) && continue
			body=$(ck_get "$i" "${cid[i]}" "${ip[j]}") && rc=0 || rc=$?
			if ((rc)) || [[ $body != "${host[j]}" ]]; then
				ck_fail "${host[i]} -> ${host[j]} by address ${ip[j]} on $net: rc=$rc body='${body:0:200}'"
				fails=1 CK_GET_RETRY=5
			else
				ck_log "${host[i]} -> ${host[j]} by address ${ip[j]}: ok"
			fi
		done
		[[ $dns == nodns ]] && continue
		# tasks.<svc> through the embedded DNS: every task's address, then
		# connect to the other nodes' ones by the resolved address.
		names=$(ck_retry 15 ck_resolve_n "$i" "${cid[i]}" "tasks.$svc" "$CK_N")
		want=$(printf '%s\n' "${ip[@]}" | sort -u)
		if ! got=$(comm -13 <(sort -u <<<"$names") <(sort <<<"$want")) || [[ -n $got ]]; then
			ck_fail "${host[i]}: tasks.$svc resolved to [$(tr '\n' ' ' <<<"$names")], missing [$(tr '\n' ' ' <<<"$got")]"
			fails=1
		else
			ck_log "${host[i]}: tasks.$svc -> $(tr '\n' ' ' <<<"$names")"
			for ((j = 0; j < CK_N; j++)); do
				((i == j)) && continue
				body=$(ck_get "$i" "${cid[i]}" "${ip[j]}") || true
				if [[ $body != "${host[j]}" ]]; then
					ck_fail "${host[i]} -> tasks.$svc (${ip[j]}): body='${body:0:200}'"
					fails=1
				fi
			done
		fi
		# Extra: busybox wget resolving the name itself (informational).
		body=$(ck_dk "$i" exec "${cid[i]}" timeout 5 wget -q -O- "http://tasks.$svc:$CK_PORT/" 2>&1) && rc=0 || rc=$?
		if ((rc == 139)); then
			ck_log "note: busybox wget segfaults resolving tasks.$svc (rc 139); nslookup path used"
		elif ((rc)) || ! grep -qxF -- "$body" <(printf '%s\n' "${host[@]}"); then
			ck_log "note: wget http://tasks.$svc:$CK_PORT/ from ${host[i]}: rc=$rc body='${body:0:100}'"
		else
			ck_log "${host[i]}: wget http://tasks.$svc:$CK_PORT/ -> $body"
		fi
	done
	return "$fails"
}

# ck_mount_source I NAME: the host directory of the plugin's mount NAME on
# node I (its settable source).
ck_mount_source() {
	local src
	src=$(ck_dk "$1" plugin inspect -f "{{range .Settings.Mounts}}{{if eq .Name \"$2\"}}{{.Source}}{{end}}{{end}}" "$E2E_PLUGIN" 2>/dev/null)
	[[ -n $src ]] && echo "$src"
}

# ck_sandbox_dir I: the plugin's sandbox directory as seen on node I's host
# (OVERLAY_SANDBOX_DIR's default): overlay-plugin/netns in the host's /run
# (the 'run' mount), or, in 0.1.0's layout, netns/ in its 'sandboxes' mount.
ck_sandbox_dir() {
	local src
	if src=$(ck_mount_source "$1" run); then
		echo "$src/overlay-plugin/netns"
		return
	fi
	src=$(ck_mount_source "$1" sandboxes) || return 1
	echo "$src/netns"
}

# ck_state_dir I: the plugin's state directory (state.db, admin.sock) as
# seen on node I's host (OVERLAY_STATE_DIR's default): overlay-plugin in the
# host's /var/lib (the 'var-lib' mount), or 0.1.0's 'state' mount.
ck_state_dir() {
	local src
	if src=$(ck_mount_source "$1" var-lib); then
		echo "$src/overlay-plugin"
		return
	fi
	ck_mount_source "$1" state
}

# ck_host_leftovers I: prints what the plugin left on node I's host: netns
# files in its sandbox dir, VXLAN devices with the plugin's VNIs (host netns
# and any netns still mounted there), their FDB entries, xfrm state/policies.
ck_host_leftovers() {
	local i=$1 dir
	dir=$(ck_sandbox_dir "$i") || { echo "cannot find the plugin's sandbox dir"; return 0; }
	ck_hx "$i" bash -s "$dir" "$CK_VNI_MIN" "$CK_VNI_MAX" <<'EOF'
dir=$1 lo=$2 hi=$3
vx() { ip -d -o link show type vxlan 2>/dev/null | awk -v lo="$lo" -v hi="$hi" '{for (k = 1; k < NF; k++) if ($k == "id" && $(k+1) >= lo && $(k+1) <= hi) {print; next}}'; }
if [[ -d $dir ]]; then
	for f in "$dir"/*; do
		[[ -e $f ]] || continue
		echo "sandbox namespace left: $f"
		nsenter --net="$f" ip -d -o link show type vxlan 2>/dev/null | sed 's/^/  vxlan in it: /'
		nsenter --net="$f" bridge fdb show 2>/dev/null | grep ' dst ' | sed 's/^/  fdb in it: /'
	done
fi
vx | sed 's/^/vxlan device in host netns: /'
ip xfrm state list 2>/dev/null | grep -E '^src ' | sed 's/^/xfrm state: /'
ip xfrm policy list 2>/dev/null | grep -E '^src ' | sed 's/^/xfrm policy: /'
nft list tables 2>/dev/null | grep -w overlay_plugin | sed 's/^/nft: /'
EOF
}

# ck_no_leftovers I SECONDS: wait up to SECONDS until ck_host_leftovers
# finds nothing on node I; fails with what is left.
ck_no_leftovers() {
	local i=$1 end=$((SECONDS + $2)) left
	while left=$(ck_host_leftovers "$i") && [[ -n $left ]] && ((SECONDS < end)); do sleep 1; done
	if [[ -n $left ]]; then
		ck_fail "node $i, $2 s after the network was removed: $(tr '\n' ';' <<<"$left")"
		return 1
	fi
	ck_log "node $i: no sandbox, VXLAN device, FDB entry, xfrm state or policy, nor nft table left"
}

# ck_host_sandboxes I: number of netns files in the plugin's sandbox dir.
ck_host_sandboxes() {
	local dir
	dir=$(ck_sandbox_dir "$1") || { echo "?"; return; }
	# shellcheck disable=SC2016 # expanded by the node's bash
	ck_hx "$1" bash -c 'n=0; for f in "$1"/*; do [[ -e $f ]] && n=$((n+1)); done; echo $n' _ "$dir"
}

ck_no_sandboxes() { [[ $(ck_host_sandboxes "$1") == 0 ]]; }

# ck_host_fdb I: remote FDB entries (dst ...) in the plugin's sandboxes on node I.
ck_host_fdb() {
	local dir
	dir=$(ck_sandbox_dir "$1") || return 0
	# shellcheck disable=SC2016 # expanded by the node's bash
	ck_hx "$1" bash -c 'for f in "$1"/*; do [[ -e $f ]] && nsenter --net="$f" bridge fdb show 2>/dev/null | grep " dst "; done' _ "$dir"
}

# ck_xfrm_packets I: packets counted by all xfrm states on node I's host.
ck_xfrm_packets() {
	ck_hx "$1" ip -s xfrm state list 2>/dev/null | awk '/lifetime current:/ {getline; for (k = 1; k <= NF; k++) if ($k ~ /\(packets\)/) {sub(/\(packets\)/, "", $k); s += $k}} END {print s + 0}'
}

# ------------------------------------------------------------------ the wire

# E2E_WIRE runs a command where every node's underlay traffic passes
# (scripts/e2e-docker.sh: "ip netns exec <its switch namespace>"), and
# E2E_WIRE_IF is the interface to listen on there: what an eavesdropper on
# the underlay sees, not what a node's own stack shows.

# ck_capture_start: tcpdump of VXLAN (UDP 4789) and ESP on the wire, headers
# only, into CK_CAPTURE, until ck_capture_verify (or the check's end).
# Without E2E_WIRE (a Vagrant run on an underlay that does not flood every
# frame to the capturing VM) it says so and the wire goes unwatched.
ck_capture_start() {
	CK_CAPTURE=
	if [[ -z ${E2E_WIRE:-} ]]; then
		ck_log "note: no E2E_WIRE: the underlay capture is not checked here"
		return 0
	fi
	[[ -n ${E2E_WIRE_IF:-} ]] || { ck_fail "E2E_WIRE_IF is needed to watch the underlay"; return 1; }
	command -v tcpdump >/dev/null || { ck_fail "tcpdump is needed to watch the underlay"; return 1; }
	local -a w
	read -ra w <<<"$E2E_WIRE"
	CK_CAPTURE=$(mktemp --suffix=.pcap)
	CK_FILES+=("$CK_CAPTURE" "$CK_CAPTURE.log")
	# -Z root: tcpdump would otherwise drop to a user that cannot write here.
	# --immediate-mode: writing to a file, libpcap hands packets over a
	# ring block at a time (a block closes when full or after its timeout),
	# and the SIGTERM of ck_capture_verify loses the open block: a check
	# whose traffic took under a second captured nothing.
	"${w[@]}" tcpdump -i "$E2E_WIRE_IF" -nn -s 128 -U --immediate-mode -Z root -w "$CK_CAPTURE" 'udp port 4789 or ip proto 50' 2>"$CK_CAPTURE.log" &
	CK_CAPTURE_PID=$!
	CK_PIDS+=("$CK_CAPTURE_PID")
	ck_retry 30 grep -q 'listening on' "$CK_CAPTURE.log" >/dev/null \
		|| { ck_fail "tcpdump on $E2E_WIRE_IF did not start: $(tr '\n' ' ' <"$CK_CAPTURE.log")"; return 1; }
	ck_log "capturing VXLAN and ESP on the underlay ($E2E_WIRE $E2E_WIRE_IF)"
}

# ck_capture_verify VNI: stops the capture; fails if it holds a VXLAN packet
# of VNI (that network's traffic in clear on the wire), or no ESP in either
# direction between two nodes (then it did not see the traffic at all).
# ck_capture_verify VNI clear: the capture's own proof, on an unencrypted
# network: it must hold VXLAN of VNI in clear between every two nodes.
ck_capture_verify() {
	local vni=$1 i j n plain fails=0 esp=0
	local -a addr
	[[ -n ${CK_CAPTURE:-} ]] || return 0
	kill -TERM "$CK_CAPTURE_PID" 2>/dev/null && wait "$CK_CAPTURE_PID" 2>/dev/null
	ck_log "capture: $(grep -E 'captured|dropped' "$CK_CAPTURE.log" | tr '\n' ' ')"
	for ((i = 0; i < CK_N; i++)); do addr[i]=$(ck_dk "$i" info -f '{{.Swarm.NodeAddr}}'); done
	# tcpdump decodes UDP 4789 as VXLAN: "VXLAN, flags [I] (0x08), vni N".
	if [[ ${2:-} == clear ]]; then
		for ((i = 0; i < CK_N; i++)); do
			for ((j = 0; j < CK_N; j++)); do
				((i == j)) && continue
				n=$(tcpdump -r "$CK_CAPTURE" -nn "udp port 4789 and src ${addr[i]} and dst ${addr[j]}" 2>/dev/null | grep -cE "vni $vni([^0-9]|$)")
				((n > 0)) || { ck_fail "the capture holds no VXLAN of VNI $vni from ${addr[i]} to ${addr[j]}: it does not see the underlay"; fails=1; }
			done
		done
		((fails)) || ck_log "on the wire: the unencrypted network's VXLAN (VNI $vni) in clear both ways between every two nodes, as the capture must show"
		return "$fails"
	fi
	for ((i = 0; i < CK_N; i++)); do
		for ((j = 0; j < CK_N; j++)); do
			((i == j)) && continue
			n=$(tcpdump -r "$CK_CAPTURE" -nn "ip proto 50 and src ${addr[i]} and dst ${addr[j]}" 2>/dev/null | grep -c .)
			((n > 0)) || { ck_fail "the capture holds no ESP from ${addr[i]} to ${addr[j]}"; fails=1; }
			esp=$((esp + n))
		done
	done
	plain=$(tcpdump -r "$CK_CAPTURE" -nn 'udp port 4789' 2>/dev/null)
	n=$(grep -cE "vni $vni([^0-9]|$)" <<<"$plain")
	if ((n > 0)); then
		ck_fail "$n VXLAN packets of VNI $vni in clear on the wire, e.g. $(grep -m1 -E "vni $vni([^0-9]|$)" <<<"$plain")"
		fails=1
	fi
	((fails)) && return 1
	n=$(grep -oE 'vni [0-9]+' <<<"$plain" | sort | uniq -c | awk '{printf " %s x%s", $3, $1}')
	ck_log "on the wire: $esp ESP packets, both ways between every two nodes; no VXLAN of VNI $vni in clear (VXLAN in clear, by VNI:${n:- none})"
}

# ck_vni I NET: the VNI of network NET, from node I's plugin.
ck_vni() {
	local nid
	nid=$(ck_dk "$1" network inspect -f '{{.Id}}' "$2") || return 1
	ck_plugin_cli "$1" state | jq -er --arg id "$nid" '.[] | select(.id == $id) | .vni'
}

# ck_policy_spis I: node I's outbound IPsec SPI per remote host, "vtep=spi ...".
ck_policy_spis() {
	ck_plugin_cli "$1" encryption | jq -er '[.remotes[] | "\(.vtep)=\(.policySPI)"] | sort | join(" ")'
}

# ck_rotation_under_stream CID ADDR [CID ADDR]...: one container and its
# overlay address per node, in node order. Each container pings the next
# node's, 5 numbered echo requests a second (a sequenced stream), while
# node 0's plugin is told `overlay-plugin rotate-keys` (the admin socket in
# its state directory). The new generation must activate within the stream
# (every node's outbound SPI changes) and no stream may lose a packet.
# CK_ROTATION_LEAD_MAX: the plugin's longest lead before a new generation
# is used, min(1 min, key rotation interval / 10).
CK_ROTATION_LEAD_MAX=60
ck_rotation_under_stream() {
	local -a cid addr before after out pids
	local i n=$(($# / 2)) count t0 act act_s fails=0 st tx rx missing
	for ((i = 0; i < n; i++)); do cid[i]=$1 addr[i]=$2; shift 2; done
	# 5 s of stream before the rotation, the longest lead, 20 s after it.
	count=$(((5 + CK_ROTATION_LEAD_MAX + 20) * 5))
	for ((i = 0; i < n; i++)); do
		before[i]=$(ck_policy_spis "$i") || { ck_fail "node $i: overlay-plugin encryption: no remote SPI"; return 1; }
	done
	t0=$SECONDS
	for ((i = 0; i < n; i++)); do
		out[i]=$(mktemp)
		CK_FILES+=("${out[i]}")
		ck_dk "$i" exec "${cid[i]}" ping -c "$count" -i 0.2 -W 10 "${addr[(i + 1) % n]}" >"${out[i]}" 2>&1 &
		pids[i]=$!
		CK_PIDS+=("${pids[i]}")
	done
	sleep 5
	st=$(ck_plugin_cli 0 rotate-keys 2>&1) || { ck_fail "node 0: overlay-plugin rotate-keys: $st"; return 1; }
	if ! act=$(ck_plugin_cli 0 encryption | jq -er '.ownGenerations | max_by(.gen) | .activateAt') || ! act_s=$(date -d "$act" +%s); then
		ck_fail "node 0: no new key generation after rotate-keys"
		return 1
	fi
	ck_log "node 0: rotate-keys at stream second $((SECONDS - t0)); the new generation activates in $((act_s - $(date +%s))) s ($act)"
	if ((act_s - $(date +%s) > CK_ROTATION_LEAD_MAX)); then
		ck_fail "the new generation activates after more than ${CK_ROTATION_LEAD_MAX} s: the stream ends before it"
		return 1
	fi
	# Every sender switches to the new generation's SAs while the streams run.
	ck_spis_changed() {
		local k
		for ((k = 0; k < n; k++)); do
			after[k]=$(ck_policy_spis "$k") && [[ ${after[k]} != "${before[k]}" ]] || return 1
		done
	}
	until ck_spis_changed; do
		if ((SECONDS - t0 > count / 5)); then
			ck_fail "the outbound SPIs did not change within the stream: before [${before[*]}], now [${after[*]}]"
			return 1
		fi
		sleep 2
	done
	ck_log "at stream second $((SECONDS - t0)) every node sends with the new generation: SPIs [${before[*]}] -> [${after[*]}]"
	for ((i = 0; i < n; i++)); do
		wait "${pids[i]}"
		tx=$(sed -nE 's/^([0-9]+) packets transmitted.*/\1/p' "${out[i]}")
		rx=$(sed -nE 's/.* ([0-9]+) packets received.*/\1/p' "${out[i]}")
		if [[ $tx != "$count" || $rx != "$tx" ]]; then
			missing=$(seq 0 $((count - 1)) | grep -vxFf <(sed -nE 's/.* seq=([0-9]+) .*/\1/p' "${out[i]}") | tr '\n' ' ')
			ck_fail "node $i -> ${addr[(i + 1) % n]}: $tx sent, $rx answered across the rotation; unanswered seq (0.2 s apart): ${missing:0:300}"
			fails=1
		else
			ck_log "node $i -> ${addr[(i + 1) % n]}: $rx of $tx numbered echo requests answered across the rotation"
		fi
	done
	return "$fails"
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

check_builtin_overlay() {
	ck_nodes "$@"
	ck_network e2e-builtin overlay || return 1
	ck_web_service e2e-builtin --mode global --network e2e-builtin || return 1
	ck_wait_tasks e2e-builtin 1 || return 1
	ck_mesh e2e-builtin e2e-builtin
}

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

check_plugin_service() {
	ck_nodes "$@"
	# The capture's proof (see ck_capture_verify): this network's VXLAN
	# must show in clear, where the encrypted checks must find none.
	ck_capture_start || return 1
	ck_network e2e-plug "$E2E_PLUGIN" || { ck_fail "docker network create -d $E2E_PLUGIN: $CK_LAST_ERROR"; return 1; }
	ck_web_service e2e-plug --mode global --network e2e-plug || return 1
	ck_wait_tasks e2e-plug 1 || return 1
	ck_mesh e2e-plug e2e-plug || return 1
	ck_have_hostx || return 0
	ck_capture_verify "$(ck_vni 0 e2e-plug)" clear || return 1
	# The managed plugin's metrics, from the host (admin socket in the
	# state directory): the joined task and the other node's are counted.
	local i m nid
	nid=$(ck_dk 0 network inspect -f '{{.Id}}' e2e-plug)
	for ((i = 0; i < CK_N; i++)); do
		m=$(ck_metrics "$i") || { ck_fail "node $i: no metrics on the admin socket"; return 1; }
		for want in "overlay_plugin_network_endpoints{joined=\"true\",network=\"$nid\"" \
			"overlay_plugin_network_remote_endpoints{network=\"$nid\"" "overlay_plugin_driver_calls_total{call=\"Join\",outcome=\"ok\"}" \
			"overlay_plugin_gossip_members_alive $CK_N"; do
			grep -qF "$want" <<<"$m" || { ck_fail "node $i: metrics lack $want"; return 1; }
		done
	done
	ck_log "metrics on every node's admin socket count the network's endpoints and Docker's calls"
}

# ck_plugin_state I: `overlay-plugin state` (JSON) of node I's plugin,
# through the admin socket in its state directory.
ck_plugin_state() { ck_plugin_cli "$1" state 2>&1; }

# ck_plugin_cli I COMMAND...: `overlay-plugin COMMAND` run on node I's host
# against its plugin's admin socket (in its state directory, ck_state_dir).
ck_plugin_cli() {
	local i=$1 src; shift
	src=$(ck_state_dir "$i") || return 1
	ck_hx "$i" "$E2E_ROOT/bin/overlay-plugin" "$@" --state-dir "$src"
}

# ck_metrics I: the plugin's Prometheus metrics on node I, read on its host
# through the admin socket in the plugin's state directory.
ck_metrics() {
	local src
	src=$(ck_state_dir "$1") || return 1
	ck_hx "$1" curl -sf --unix-socket "$src/admin.sock" http://plugin/metrics
}

# ck_web_containers NET NAME: a container NAME-<i> on every node i (docker
# run), on NET, serving its node's host name over HTTP on $CK_PORT; fills
# the caller's arrays cid, ip and host.
ck_web_containers() {
	local net=$1 name=$2 i out
	for ((i = 0; i < CK_N; i++)); do
		host[i]=$(ck_dk "$i" info -f '{{.Name}}')
		out=$(ck_dk "$i" run -d --name "$name-$i" --hostname "${host[i]}" --network "$net" "$E2E_IMAGE" \
			sh -c "hostname >/www/index.html; exec httpd -f -p $CK_PORT -h /www" 2>&1) || {
			ck_fail "docker run --network $net on ${host[i]}: $out"
			return 1
		}
		CK_CONTAINERS+=("$i:$name-$i")
		cid[i]=$out
		ip[i]=$(ck_ip "$i" "${cid[i]}" "$net")
		ck_log "container $name-$i on ${host[i]}: ${ip[i]}"
	done
}

# ck_containers_mesh NAME [names]: the caller's ck_web_containers NAME
# reach each other across hosts by address; with "names", by container name
# too (Docker's embedded DNS must give the container's address), otherwise
# what the name resolves to is only noted.
ck_containers_mesh() {
	local name=$1 names=${2:-} i j out rc fails=0
	for ((i = 0; i < CK_N; i++)); do
		for ((j = 0; j < CK_N; j++)); do
			((i == j)) && continue
			out=$(ck_get "$i" "${cid[i]}" "${ip[j]}") && rc=0 || rc=$?
			if ((rc)) || [[ $out != "${host[j]}" ]]; then
				ck_fail "${host[i]} -> ${host[j]} (${ip[j]}): rc=$rc body='${out:0:200}'"
				fails=1
			else
				ck_log "${host[i]} -> ${host[j]} (${ip[j]}): ok"
			fi
			if [[ $names != names ]]; then
				out=$(ck_resolve "$i" "${cid[i]}" "$name-$j" | tr '\n' ' ')
				ck_log "note: ${host[i]} resolves $name-$j to [${out}]"
			elif out=$(ck_retry 15 ck_resolve_n "$i" "${cid[i]}" "$name-$j" 1) && [[ $out == "${ip[j]}" ]]; then
				ck_log "${host[i]} -> $name-$j by name: ${ip[j]}"
			else
				ck_fail "${host[i]}: $name-$j resolves to [$(tr '\n' ' ' <<<"$out")], want ${ip[j]}"
				fails=1
			fi
		done
	done
	return "$fails"
}

check_plugin_attachable() {
	ck_nodes "$@"
	ck_network e2e-att "$E2E_PLUGIN" --attachable || { ck_fail "network create --attachable: $CK_LAST_ERROR"; return 1; }
	local -a cid ip host
	ck_web_containers e2e-att e2e-att || return 1
	# By container name only noted: swarm-scope service discovery.
	ck_containers_mesh e2e-att
}

check_plugin_encrypted() {
	ck_nodes "$@"
	local out errs i
	if ((E2E_EXPECT_ESP == 0)); then
		if ! ck_network e2e-enc "$E2E_PLUGIN" --opt encrypted; then
			if grep -qE "$CK_ESP_RE" <<<"$CK_LAST_ERROR"; then
				ck_log "network create refused with a clear error: $CK_LAST_ERROR"
				return 0
			fi
			ck_fail "network create --opt encrypted failed, but the error names no missing kernel support: $CK_LAST_ERROR"
			return 1
		fi
		# Created: swarm allocates networks asynchronously, so the refusal
		# comes from each host's CreateNetwork, and Docker shows it on the
		# failed tasks: `docker service ps --no-trunc`, as the README says.
		ck_web_service e2e-enc --mode global --network e2e-enc --restart-condition none || return 1
		local end=$((SECONDS + 45)) nid st
		while ((SECONDS < end)); do
			for ((i = 0; i < CK_N; i++)); do
				if [[ -n $(ck_running_cids "$i" e2e-enc) ]]; then
					ck_fail "a task runs on encrypted network e2e-enc on node $i although the kernel lacks ESP: plaintext network"
					return 1
				fi
			done
			errs=$(ck_task_errors e2e-enc)
			grep -qE "$CK_ESP_RE" <<<"$errs" && break
			sleep 3
		done
		if ! grep -qE "$CK_ESP_RE" <<<"$errs"; then
			out=$(ck_dk 0 service ps --format '{{.CurrentState}}' e2e-enc | awk '{print $1}' | sort | uniq -c | tr -s ' \n' ' ')
			ck_fail "no task error names the missing kernel support (ESP/GCM) in docker service ps --no-trunc (states: $out; errors: [$(tr '\n' ';' <<<"$errs")])"
			return 1
		fi
		ck_log "tasks fail with a clear error: $(grep -E "$CK_ESP_RE" <<<"$errs" | head -1)"
		# The plugin's own account, on every node: `overlay-plugin state`
		# names the refused network and why, and a metric counts it.
		nid=$(ck_dk 0 network inspect -f '{{.Id}}' e2e-enc)
		for ((i = 0; i < CK_N; i++)); do
			st=$(ck_plugin_state "$i") || { ck_fail "node $i: overlay-plugin state failed: $st"; return 1; }
			if ! grep -q '"refused"' <<<"$(grep -A8 "\"$nid\"" <<<"$st")" || ! grep -qE "$CK_ESP_RE" <<<"$st"; then
				ck_fail "node $i: overlay-plugin state does not name refused network $nid with the reason: ${st:0:400}"
				return 1
			fi
			# Not `ck_metrics | grep -q`: under pipefail, grep's early exit
			# makes the writer's SIGPIPE the pipeline's status.
			if ! grep -q "overlay_plugin_network_refusals_total{network=\"$nid\"}" <<<"$(ck_metrics "$i")"; then
				ck_fail "node $i: no overlay_plugin_network_refusals_total for $nid"
				return 1
			fi
		done
		ck_log "overlay-plugin state and the metrics name the refused network on every node"
		return 0
	fi
	ck_encrypted_esp
}

# ck_encrypted_esp: check_plugin_encrypted where the kernel has ESP. On an
# encrypted attachable network, a global dnsrr service and a container per
# node (docker run): traffic both ways between every two nodes, by address
# and by name; every node's xfrm counters grow; a forced key rotation under
# a sequenced stream loses nothing; once the service, the containers and
# the network are removed, no SA, policy or nft table is left on any node;
# and a capture on the wire all along holds ESP between every two nodes and
# not one VXLAN packet of the network's VNI in clear.
ck_encrypted_esp() {
	ck_have_hostx || { ck_fail "E2E_HOSTX is needed to read the hosts' xfrm state"; return 1; }
	local i vni fails=0 after states
	local -a before cid ip host
	ck_capture_start || return 1
	ck_network e2e-enc "$E2E_PLUGIN" --attachable --opt encrypted || { ck_fail "network create --opt encrypted: $CK_LAST_ERROR"; return 1; }
	ck_web_service e2e-enc --mode global --network e2e-enc || return 1
	ck_web_containers e2e-enc e2e-enc-c || return 1
	ck_wait_tasks e2e-enc 1 || return 1
	vni=$(ck_vni 0 e2e-enc) || { ck_fail "node 0: overlay-plugin state has no VNI for e2e-enc"; return 1; }
	for ((i = 0; i < CK_N; i++)); do before[i]=$(ck_xfrm_packets "$i"); done
	ck_mesh e2e-enc e2e-enc || return 1
	ck_containers_mesh e2e-enc-c names || return 1
	for ((i = 0; i < CK_N; i++)); do
		after=$(ck_xfrm_packets "$i")
		states=$(ck_hx "$i" ip xfrm state list 2>/dev/null | grep -c 'proto esp')
		ck_log "node $i: $states ESP states, xfrm packets ${before[i]} -> $after"
		if ((states == 0 || after <= before[i])); then
			ck_fail "node $i: traffic on e2e-enc did not go through ESP (states=$states, packets ${before[i]} -> $after)"
			fails=1
		fi
	done
	((fails)) && return 1
	local -a pairs
	for ((i = 0; i < CK_N; i++)); do pairs+=("${cid[i]}" "${ip[i]}"); done
	ck_rotation_under_stream "${pairs[@]}" || fails=1
	# Teardown: the plugin removes what it programmed, SAs 20 s after the last
	# endpoint towards a host went (see README, Encryption).
	ck_remove
	if ck_dk 0 network inspect e2e-enc >/dev/null 2>&1; then
		ck_fail "network rm e2e-enc failed"
		fails=1
	fi
	for ((i = 0; i < CK_N; i++)); do
		ck_no_leftovers "$i" 60 || fails=1
	done
	ck_capture_verify "$vni" || fails=1
	return "$fails"
}

check_coexistence() {
	ck_nodes "$@"
	ck_network e2e-co-builtin overlay || return 1
	ck_network e2e-co-plug "$E2E_PLUGIN" || { ck_fail "network create: $CK_LAST_ERROR"; return 1; }
	ck_web_service e2e-co --mode global --network e2e-co-builtin --network e2e-co-plug || return 1
	ck_wait_tasks e2e-co 1 || return 1
	local fails=0
	ck_mesh e2e-co e2e-co-builtin || fails=1
	ck_mesh e2e-co e2e-co-plug nodns || fails=1
	return "$fails"
}

check_teardown() {
	ck_nodes "$@"
	ck_have_hostx || { ck_fail "E2E_HOSTX is needed to inspect the hosts"; return 1; }
	local i fails=0 n
	ck_network e2e-td "$E2E_PLUGIN" || { ck_fail "network create: $CK_LAST_ERROR"; return 1; }
	# Scale up: two tasks per node.
	ck_web_service e2e-td --replicas "$((2 * CK_N))" --replicas-max-per-node 2 --network e2e-td || return 1
	ck_wait_tasks e2e-td 2 || return 1
	ck_mesh e2e-td e2e-td || fails=1
	for ((i = 0; i < CK_N; i++)); do
		ck_log "node $i at scale $((2 * CK_N)): $(ck_host_sandboxes "$i") sandbox(es), $(ck_host_fdb "$i" | grep -c .) remote FDB entries"
	done
	# Scale down to one task: the nodes without a task must drop the network.
	ck_dk 0 service scale -d e2e-td=1 >/dev/null || { ck_fail "service scale e2e-td=1 failed"; return 1; }
	local end=$((SECONDS + 60)) total
	while :; do
		total=0
		for ((i = 0; i < CK_N; i++)); do total=$((total + $(ck_running_cids "$i" e2e-td | grep -c .))); done
		((total == 1)) && break
		((SECONDS >= end)) && { ck_fail "scale to 1: $total tasks still running after 60 s"; return 1; }
		sleep 1
	done
	sleep 3
	for ((i = 0; i < CK_N; i++)); do
		n=$(ck_running_cids "$i" e2e-td | grep -c .)
		ck_log "node $i at scale 1 ($n local task): $(ck_host_sandboxes "$i") sandbox(es), $(ck_host_fdb "$i" | grep -c .) remote FDB entries"
		if ((n == 0)); then
			ck_retry 30 ck_no_sandboxes "$i" >/dev/null \
				|| { ck_fail "node $i has no task of e2e-td but still $(ck_host_sandboxes "$i") sandbox(es) after 30 s"; fails=1; }
		fi
	done
	# Scale to zero, remove the service and the network: nothing may be left.
	ck_dk 0 service scale -d e2e-td=0 >/dev/null || fails=1
	ck_dk 0 service rm e2e-td >/dev/null || fails=1
	end=$((SECONDS + 60))
	while [[ -n $(ck_all_task_containers e2e-td) ]] && ((SECONDS < end)); do sleep 1; done
	ck_dk 0 network rm e2e-td >/dev/null || { ck_fail "network rm e2e-td failed"; fails=1; }
	CK_SERVICES=() CK_NETWORKS=()
	for ((i = 0; i < CK_N; i++)); do
		ck_no_leftovers "$i" 30 || fails=1
	done
	return "$fails"
}

check_disable_enable() {
	ck_nodes "$@"
	# Where the kernel has ESP (the test VM, the Vagrant VMs), on an
	# encrypted network: the plugin hands its IPsec state over to its next
	# run as well, and nothing of the network crosses the wire in clear
	# while a plugin is away or starting (a capture all along).
	local -a opts=(--attachable)
	local esp=0
	[[ ${E2E_EXPECT_ESP:-0} == 1 ]] && esp=1 opts+=(--opt encrypted)
	if ((esp)); then ck_capture_start || return 1; fi
	ck_network e2e-de "$E2E_PLUGIN" "${opts[@]}" || { ck_fail "network create: $CK_LAST_ERROR"; return 1; }
	ck_web_service e2e-de --mode global --network e2e-de || return 1
	ck_wait_tasks e2e-de 1 || return 1
	# A second endpoint on node 0 (docker run): same-host traffic, which
	# crosses only node 0's sandbox.
	local local_cid
	local_cid=$(ck_dk 0 run -d --name e2e-de-local --network e2e-de "$E2E_IMAGE" sleep 100000) \
		|| { ck_fail "docker run on e2e-de failed"; return 1; }
	CK_CONTAINERS+=("0:e2e-de-local")
	local i out fails=0 n
	local -a before after
	# shellcheck disable=SC2317 # called through ck_retry
	ck_local() { # node 0's extra container -> node 0's task
		local t
		t=$(ck_running_cids 0 e2e-de | head -1)
		[[ -n $t ]] && ck_dk 0 exec "$local_cid" timeout 5 wget -q -O- "http://$(ck_ip 0 "$t" e2e-de):$CK_PORT/"
	}
	# ck_traffic WHEN: same-host and cross-host traffic of the running tasks.
	ck_traffic() {
		if ! ck_retry 10 ck_local >/dev/null; then
			ck_fail "$1: node 0's container no longer reaches node 0's task (interfaces: $(ck_dk 0 exec "$local_cid" ip -o link 2>/dev/null | awk -F': ' '{print $2}' | tr '\n' ' '))"
			return 1
		fi
		ck_mesh e2e-de e2e-de nodns || { ck_fail "$1: the running tasks no longer reach each other across hosts"; return 1; }
		ck_log "$1: same-host and cross-host traffic of the running tasks: ok"
	}
	ck_traffic "before the disable" || return 1
	for ((i = 0; i < CK_N; i++)); do before[i]=$(ck_running_cids "$i" e2e-de | head -1); done
	# One node at a time, as an operator would. The sandboxes sit on a host
	# mount (the host's /run, the plugin's 'run' mount), so the kernel data path, and the
	# containers' interfaces, live on while the plugin is gone.
	for ((i = 0; i < CK_N; i++)); do
		out=$(ck_dk "$i" plugin disable -f "$E2E_PLUGIN" 2>&1) || { ck_fail "node $i: plugin disable -f: $out"; return 1; }
		ck_log "node $i: plugin disabled"
		if ck_have_hostx; then
			n=$(ck_host_sandboxes "$i")
			[[ $n != 0 && $n != "?" ]] || { ck_fail "node $i: no sandbox left on the host while the plugin is disabled ($n)"; fails=1; }
			ck_log "node $i while disabled: $n sandbox(es) on the host"
		fi
		ck_traffic "node $i's plugin disabled" || fails=1
		out=$(ck_dk "$i" plugin enable --timeout "${PLUGIN_ENABLE_TIMEOUT:-30}" "$E2E_PLUGIN" 2>&1) || { ck_fail "node $i: plugin enable: $out"; return 1; }
		ck_log "node $i: plugin enabled again"
	done
	for ((i = 0; i < CK_N; i++)); do
		after[i]=$(ck_running_cids "$i" e2e-de | head -1)
		if [[ ${after[i]} != "${before[i]}" ]]; then
			ck_fail "node $i: swarm replaced the task ${before[i]:0:12} -> ${after[i]:0:12}: the check needs the same containers"
			fails=1
		fi
	done
	ck_traffic "after enable" || fails=1
	# The plugin resumed its networks from its state: Docker's calls for the
	# old tasks succeed, and new tasks (a new Join on the adopted sandbox)
	# work by address and by name.
	ck_dk 0 rm -f e2e-de-local >/dev/null 2>&1 || { ck_fail "docker rm of the extra container failed"; fails=1; }
	ck_dk 0 service update -d --force e2e-de >/dev/null 2>&1 || { ck_fail "service update --force failed"; return 1; }
	# shellcheck disable=SC2317 # called through ck_retry
	ck_replaced() { # every node runs a task other than the one before the update
		local i c
		for ((i = 0; i < CK_N; i++)); do
			c=$(ck_running_cids "$i" e2e-de | head -1)
			[[ -n $c && $c != "${after[i]}" ]] || return 1
		done
	}
	if ! ck_retry "$E2E_TASK_TIMEOUT" ck_replaced >/dev/null; then
		ck_fail "the service's tasks were not replaced after service update --force"
		return 1
	fi
	if ck_mesh e2e-de e2e-de dns; then
		ck_log "after enable: new tasks reach each other across hosts, by address and by name"
	else
		ck_fail "new tasks on the plugin network do not reach each other after disable -f / enable"
		fails=1
	fi
	if ((esp)); then
		local vni
		vni=$(ck_vni 0 e2e-de) || { ck_fail "node 0: overlay-plugin state has no VNI for e2e-de"; return 1; }
		ck_capture_verify "$vni" || fails=1
	fi
	return "$fails"
}

# check_plugin_logs: the plugin's lines in dockerd's log carry the plugin's
# level (its INFO and DEBUG on stdout, which dockerd logs at info; WARN and
# ERROR on stderr, at error), and no worker's dockerd was asked GET /nodes
# (it answers only on a manager, and logs every refusal as an error). Run
# last, so the plugin has been at it for a while.
check_plugin_logs() {
	ck_nodes "$@"
	[[ -n ${E2E_NODE_LOG:-} ]] || { ck_fail "E2E_NODE_LOG is needed to read dockerd's log"; return 1; }
	local i fails=0 lines plines pairs wrong n stop_errors
	for ((i = 0; i < CK_N; i++)); do
		lines=$(ck_node_log "$i")
		plines=$(grep -E 'plugin=[0-9a-f]{64}' <<<"$lines")
		# "<dockerd level> <plugin level>" of every plugin line in slog's format
		pairs=$(sed -nE 's/.* level=([a-z]+) msg="time=[^ ]+ level=([A-Z]+)[-+0-9]* .*/\1 \2/p' <<<"$plines")
		n=$(grep -c '^info INFO$' <<<"$pairs")
		wrong=$(grep -vE '^(info (DEBUG|INFO)|error (WARN|ERROR))$' <<<"$pairs" | grep . | sort | uniq -c | tr -s ' \n' ' ')
		if ((n == 0)); then
			ck_fail "node $i: no INFO line of the plugin logged by dockerd at level=info"
			fails=1
		elif [[ -n $wrong ]]; then
			ck_fail "node $i: plugin lines at the wrong dockerd level (count, dockerd's, plugin's): $wrong"
			fails=1
		else
			ck_log "node $i: $(grep -c . <<<"$pairs") plugin lines, each at its level: $(awk '{print $1 "/" $2}' <<<"$pairs" | sort | uniq -c | tr -s ' \n' ' ')"
		fi
		# A plugin stop (disable_enable) is no error: memberlist's writes on
		# the closed transport and its cancelled dials are logged at DEBUG.
		stop_errors=$(grep -E 'level=ERROR.*(use of closed network connection|operation was canceled|context canceled)' <<<"$plines")
		if [[ -n $stop_errors ]]; then
			ck_fail "node $i: $(grep -c . <<<"$stop_errors") plugin ERROR lines of a stop: $(head -n1 <<<"$stop_errors" | cut -c1-200)"
			fails=1
		fi
		[[ $(ck_dk "$i" info -f '{{.Swarm.ControlAvailable}}') == true ]] && continue
		n=$(grep -c 'not a swarm manager' <<<"$lines")
		if ((n > 0)); then
			ck_fail "node $i (a worker): dockerd logged $n 'not a swarm manager' errors: $(grep -m1 'not a swarm manager' <<<"$lines" | cut -c1-200)"
			fails=1
		else
			ck_log "node $i (a worker): no 'not a swarm manager' error in dockerd's log"
		fi
	done
	return "$fails"
}

# ck_vip_names I CID NAME N: the distinct answers of N requests from
# container CID on node I to http://NAME:$CK_PORT/ (a service's VIP).
ck_vip_names() {
	# One exec for all N: each wget is still its own connection, balanced on
	# its own, and a docker exec costs seconds on an emulated VM.
	# shellcheck disable=SC2016 # expanded by the container's sh
	ck_dk "$1" exec "$2" sh -c 'n=$1; while [ "$n" -gt 0 ]; do timeout 3 wget -q -O- "$2"; n=$((n - 1)); done; true' \
		sh "$4" "http://$3:$CK_PORT/" 2>/dev/null | sort | uniq -c | awk '{printf "%s(%d) ", $2, $1}'
}

# ck_vip_expect I CID NAME WANT: within 15 s, 30 requests to NAME from CID
# are answered by exactly the tasks in WANT ("task1 task2 ..."), each at
# least once.
ck_vip_expect() {
	local i=$1 cid=$2 name=$3 want=$4 got names end=$((SECONDS + 15))
	while :; do
		got=$(ck_vip_names "$i" "$cid" "$name" 30)
		names=$(sed -E 's/\([0-9]+\)//g' <<<"$got" | tr ' ' '\n' | grep . | sort | tr '\n' ' ')
		[[ ${names% } == "$want" ]] && { ck_log "node $i: 30 requests to $name: $got"; return 0; }
		((SECONDS < end)) || { ck_fail "node $i: 30 requests to $name answered by [$got], want each of [$want]"; return 1; }
		sleep 1
	done
}

# ck_running_total SVC N: wait until SVC runs N tasks over all nodes.
ck_running_total() {
	local end=$((SECONDS + E2E_TASK_TIMEOUT)) i n
	while :; do
		n=0
		for ((i = 0; i < CK_N; i++)); do n=$((n + $(ck_running_cids "$i" "$1" | grep -c .))); done
		((n == $2)) && return 0
		((SECONDS < end)) || { ck_fail "service $1: $n running tasks, want $2, after ${E2E_TASK_TIMEOUT}s"; return 1; }
		sleep 1
	done
}

# ck_lb_table I CID: the plugin's load-balancing table in container CID on
# node I, from the host ("" when none).
ck_lb_table() {
	local pid
	pid=$(ck_dk "$1" inspect -f '{{.State.Pid}}' "$2") || return 1
	ck_hx "$1" nsenter --net="/proc/$pid/ns/net" nft list tables | grep overlay_plugin || true
}

# check_plugin_vip (h): services in Docker's default endpoint mode (VIP) on a
# plugin network. A 3-replica service answers by name from a container on
# every node, each task in turn; it follows scale 1, 0 (nothing answers)
# and 3; removed, it leaves no rule in the containers. Then a
# `docker stack deploy` of two services, one calling the other by name.
check_plugin_vip() {
	ck_nodes "$@"
	local net=e2e-vip svc=e2e-vip cl=e2e-vipc i out start
	local -a cid
	ck_network "$net" "$E2E_PLUGIN" --attachable || { ck_fail "docker network create -d $E2E_PLUGIN: $CK_LAST_ERROR"; return 1; }
	CK_SERVICES+=("$svc" "$cl")
	out=$(ck_dk 0 service create -d --name "$svc" --no-resolve-image --replicas 3 --network "$net" \
		--hostname 'task{{.Task.Slot}}' --stop-grace-period 1s "$E2E_IMAGE" \
		sh -c "hostname >/www/index.html; exec httpd -f -p $CK_PORT -h /www" 2>&1) \
		|| { ck_fail "service create $svc: $out"; return 1; }
	# The clients are dnsrr: no VIP of their own, so that once the service
	# goes their namespaces must hold no table at all.
	out=$(ck_dk 0 service create -d --name "$cl" --no-resolve-image --mode global --network "$net" \
		--endpoint-mode dnsrr --stop-grace-period 1s "$E2E_IMAGE" sleep 3600 2>&1) || { ck_fail "service create $cl: $out"; return 1; }
	ck_wait_tasks "$cl" 1 || return 1
	ck_running_total "$svc" 3 || return 1
	for ((i = 0; i < CK_N; i++)); do
		cid[i]=$(ck_running_cids "$i" "$cl" | head -1)
		ck_log "node $i: $svc resolves to $(ck_resolve "$i" "${cid[i]}" "$svc" | tr '\n' ' ')(the VIP)"
		ck_vip_expect "$i" "${cid[i]}" "$svc" "task1 task2 task3" || return 1
	done

	ck_dk 0 service scale -d "$svc=1" >/dev/null || { ck_fail "service scale $svc=1"; return 1; }
	ck_running_total "$svc" 1 || return 1
	for ((i = 0; i < CK_N; i++)); do ck_vip_expect "$i" "${cid[i]}" "$svc" "task1" || return 1; done

	# With no task, Docker drops the name's record and the service from its
	# listing (as on its own overlay): nothing may answer.
	ck_dk 0 service scale -d "$svc=0" >/dev/null || { ck_fail "service scale $svc=0"; return 1; }
	ck_running_total "$svc" 0 || return 1
	sleep 2
	for ((i = 0; i < CK_N; i++)); do
		if out=$(ck_dk "$i" exec "${cid[i]}" timeout 5 wget -q -O- "http://$svc:$CK_PORT/" 2>&1); then
			ck_fail "node $i: $svc with no task answered: $out"
			return 1
		fi
		ck_log "node $i: $svc with no task: no answer (${out//$'\n'/ })"
	done

	ck_dk 0 service scale -d "$svc=3" >/dev/null || { ck_fail "service scale $svc=3"; return 1; }
	ck_running_total "$svc" 3 || return 1
	for ((i = 0; i < CK_N; i++)); do ck_vip_expect "$i" "${cid[i]}" "$svc" "task1 task2 task3" || return 1; done

	ck_dk 0 service rm "$svc" >/dev/null || { ck_fail "service rm $svc"; return 1; }
	if ck_have_hostx; then
		local end=$((SECONDS + 15)) left
		for ((i = 0; i < CK_N; i++)); do
			while left=$(ck_lb_table "$i" "${cid[i]}") && [[ -n $left ]]; do
				((SECONDS < end)) || { ck_fail "node $i: the client still holds [$left] 15 s after $svc was removed"; return 1; }
				sleep 1
			done
		done
		ck_log "after service rm: no load-balancing table left in the clients"
	fi
	ck_vip_stack || return 1
}

# ck_vip_stack: `docker stack deploy` of a compose file, unchanged from what
# Docker's own overlay takes but for the driver: "front" serves what it
# fetched from "api" by name, through api's VIP; a client reads it through
# front's VIP on every node.
ck_vip_stack() {
	local dir stack=e2evs i out end
	dir=$(mktemp -d)
	cat >"$dir/stack.yml" <<YAML
version: "3.8"
services:
  api:
    image: $E2E_IMAGE
    command: ["sh", "-c", "echo api-says-hello >/www/index.html; exec httpd -f -p $CK_PORT -h /www"]
    deploy: {replicas: 2}
    networks: [app]
  front:
    image: $E2E_IMAGE
    command: ["sh", "-c", "while :; do wget -q -O /www/index.html.new http://api:$CK_PORT/ && mv /www/index.html.new /www/index.html; sleep 1; done & exec httpd -f -p $CK_PORT -h /www"]
    deploy: {replicas: 2}
    networks: [app]
  client:
    image: $E2E_IMAGE
    command: ["sleep", "3600"]
    deploy: {mode: global}
    networks: [app]
networks:
  app:
    driver: $E2E_PLUGIN
YAML
	out=$(ck_dk 0 stack deploy --resolve-image never -c "$dir/stack.yml" "$stack" 2>&1)
	rm -rf "$dir"
	CK_SERVICES+=("${stack}_front" "${stack}_api" "${stack}_client")
	CK_NETWORKS+=("${stack}_app")
	grep -qxF "$stack" <<<"$(ck_dk 0 stack ls --format '{{.Name}}')" || { ck_fail "stack deploy: $out"; return 1; }
	ck_log "docker stack deploy $stack: $(tr '\n' ' ' <<<"$out")"
	ck_wait_tasks "${stack}_client" 1 || return 1
	ck_running_total "${stack}_front" 2 || return 1
	ck_running_total "${stack}_api" 2 || return 1
	for ((i = 0; i < CK_N; i++)); do
		local c
		c=$(ck_running_cids "$i" "${stack}_client" | head -1)
		end=$((SECONDS + 30))
		until out=$(ck_dk "$i" exec "$c" timeout 3 wget -q -O- "http://front:$CK_PORT/" 2>&1) && [[ $out == api-says-hello ]]; do
			((SECONDS < end)) || { ck_fail "node $i: http://front:$CK_PORT/ -> '${out:0:100}', want what front fetched from api"; return 1; }
			sleep 1
		done
		ck_log "node $i: client -> front (VIP) -> api (VIP): $out"
	done
	ck_dk 0 stack rm "$stack" >/dev/null 2>&1
}

# ------------------------------------------------------------------ Go

# The checks ported to Go (test/dockere2e: check_plugin_service is
# TestCheckPluginService), run from its test binary E2E_GO_TEST (built
# static by e2e_build_plugin, scripts/e2e/lib.sh) with the swarm named in
# its environment (test/dockere2e/env.go). E2E_GO_HOSTX[i], where set,
# replaces E2E_HOSTX[i] for it: a command to exec, not a shell function.
E2E_GO_CHECKS=(check_builtin_overlay check_plugin_service check_plugin_attachable check_plugin_encrypted
	check_coexistence check_teardown check_disable_enable check_plugin_vip check_plugin_logs)
: "${E2E_GO_TEST:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/e2e/dockere2e.test}"
declare -p E2E_GO_HOSTX >/dev/null 2>&1 || E2E_GO_HOSTX=()

# ck_go_name FUNC: the Go test of check function FUNC.
ck_go_name() { sed -E 's/(^|_)([a-z])/\U\2/g; s/^/Test/' <<<"$1"; }

# ck_go_check FUNC: run FUNC's Go test; its output goes to the log, the
# line before its verdict is the reason of a failure.
ck_go_check() {
	local test out hostx='' logs='' i rc
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
		"$E2E_GO_TEST" -test.run "^$test\$" -test.v -test.count=1 -test.timeout 60m 2>&1 | tee "$out" >&2
	rc=${PIPESTATUS[0]}
	grep -q -- "^--- PASS: $test " "$out" && ((rc == 0)) && return 0
	ck_fail "$test: $(awk '/^--- FAIL/ {print last; exit} /^ +[a-z_]+\.go:[0-9]+: / {sub(/^ +/, ""); last = $0}' "$out" | cut -c1-400)"
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
	check_coexistence check_teardown check_disable_enable check_plugin_vip check_plugin_logs)
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
