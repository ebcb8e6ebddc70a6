# shellcheck shell=bash
# scripts/e2e/upgrade.sh: a rolling upgrade N-1 -> N from a registry, under
# live traffic, on the real swarm (issue 20). Sourced by scripts/e2e-docker.sh
# after lib.sh and checks.sh; it runs nothing by itself.
#
# Harness side (e2e_*): the previous release built from this repository's
# history (e2e_build_prev_plugin), a registry of its own in the run's
# namespaces (e2e_registry_start/stop, scripts/e2e/lib.sh) and both releases
# pushed to it (e2e_upgrade_publish). Check side, check_upgrade: on FRESH
# engines (no container ever run, no plugin installed), every node installs
# the previous release from the registry as an operator would; a workload
# runs on a plugin network (a VIP service with a task on every node, a
# container per node, a numbered ping stream and a TCP stream between two
# nodes' containers); each node in turn is upgraded the README's way
# (disable -f, upgrade, enable), and then a new container on it reaches the
# others by address and by service name. Twice: the nodes in order, then in
# the reverse order from the previous release again.
#
# It prints one greppable line per node and run:
#   upgrade: order=node1,node2 node=node1 down=4.2s ping_lost=0/150 tcp_lost=0/150 [allowed=22]
# and, per run, the windows before the first and after the last upgrade and
# the total. A stream may lose no more than the packets sent while a node's
# own plugin was down (ceil(down * 5) in that node's window), none outside.
#
# Settings (environment):
#   E2E_REGISTRY            host:port of the registry (lib.sh)
#   E2E_UPGRADE_FROM        the previous release (0.1.0) and
#   E2E_UPGRADE_FROM_COMMIT its commit in this repository's history (b9efa67)
#   E2E_UPGRADE_TO          the release of this tree (the VERSION file)
#   E2E_UPGRADE_SETTINGS_FN name of a function printing node I's install
#                           settings (K=V ...; lib.sh: e2e_plugin_settings)

: "${E2E_UPGRADE_FROM:=0.1.0}"
: "${E2E_UPGRADE_FROM_COMMIT:=b9efa67}"
: "${E2E_UPGRADE_SETTINGS_FN:=}"
E2E_UPGRADE_REPO=overlay-plugin
CK_UP_NET=e2e-up
CK_UP_SVC=e2e-upv
CK_UP_TCP_PORT=9000
CK_UP_HOLD=${CK_UP_HOLD:-5}   # seconds of streams after each node's upgrade and checks

# ------------------------------------------------------------------ its helpers
# (beside checks.sh's, which the README's check shares; the other checks
# are Go's, test/dockere2e)

# Docker's VNIs start at 4096; the plugin's are 256..4095.
CK_VNI_MIN=256 CK_VNI_MAX=4095

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
		# health/ holds the data-path probes' endpoints while the plugin runs
		[[ -e $f && ! -d $f ]] || continue
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

# ck_vip_names I CID NAME N: the distinct answers of N requests from
# container CID on node I to http://NAME:$CK_PORT/ (a service's VIP).
ck_vip_names() {
	# One exec for all N: each wget is still its own connection, balanced on
	# its own, and a docker exec costs seconds on an emulated VM.
	# shellcheck disable=SC2016 # expanded by the container's sh
	ck_dk "$1" exec "$2" sh -c 'n=$1; while [ "$n" -gt 0 ]; do timeout 3 wget -q -O- "$2"; n=$((n - 1)); done; true' \
		sh "$4" "http://$3:$CK_PORT/" 2>/dev/null | sort | uniq -c | awk '{printf "%s(%d) ", $2, $1}'
}

# e2e_upgrade_to: the release this tree builds (VERSION, as the Makefile).
e2e_upgrade_to() {
	if [[ -n ${E2E_UPGRADE_TO:-} ]]; then
		echo "$E2E_UPGRADE_TO"
	elif [[ -s $E2E_ROOT/VERSION ]]; then
		tr -d ' \n' <"$E2E_ROOT/VERSION"
	else
		return 1
	fi
}

# e2e_prev_plugin_dir: where the previous release's plugin directory is built.
e2e_prev_plugin_dir() { echo "$E2E_ROOT/build/plugin-$E2E_UPGRADE_FROM"; }

# e2e_build_prev_plugin: the previous release's plugin directory, built from
# this repository's history (git archive of its commit, `make plugin` there,
# the release stamped in as VERSION) into e2e_prev_plugin_dir. Kept as is
# with E2E_SKIP_BUILD=1 (the test VM: built on the host before the boot).
# Returns 2 when the history lacks the commit (a shallow clone).
e2e_build_prev_plugin() {
	local out tmp rc
	out=$(e2e_prev_plugin_dir)
	if [[ ${E2E_SKIP_BUILD:-0} == 1 && -f $out/config.json ]]; then
		log "E2E_SKIP_BUILD=1: using $out as is"
		return 0
	fi
	if ! git -C "$E2E_ROOT" cat-file -e "$E2E_UPGRADE_FROM_COMMIT^{commit}" 2>/dev/null; then
		log "the repository's history lacks $E2E_UPGRADE_FROM_COMMIT (release $E2E_UPGRADE_FROM): a shallow clone? (git fetch --unshallow)"
		return 2
	fi
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/oe-prev.XXXXXX")
	log "building release $E2E_UPGRADE_FROM from $E2E_UPGRADE_FROM_COMMIT in $tmp"
	git -C "$E2E_ROOT" archive --format=tar "$E2E_UPGRADE_FROM_COMMIT" | tar -x -C "$tmp" \
		&& make -C "$tmp" --no-print-directory plugin VERSION="$E2E_UPGRADE_FROM" >&2 \
		&& rm -rf "$out" && mkdir -p "$(dirname "$out")" && cp -a "$tmp/build/plugin" "$out"
	rc=$?
	rm -rf "$tmp"
	((rc == 0)) || { log "building release $E2E_UPGRADE_FROM failed"; return 1; }
	log "release $E2E_UPGRADE_FROM: $out"
}

# e2e_push_plugin_dir I DIR REF: `docker plugin create` + `docker plugin
# push` from node I's engine; the local copy is removed again, so the node
# installs REF from the registry like the others.
e2e_push_plugin_dir() {
	local i=$1 dir=$2 ref=$3
	e2e_dkt 60 "$i" plugin rm -f "$ref" >/dev/null 2>&1
	e2e_run e2e_dkt 120 "$i" plugin create "$ref" "$dir" || return 1
	e2e_run e2e_dkt 300 "$i" plugin push "$ref" || { e2e_dkt 60 "$i" plugin rm -f "$ref" >/dev/null 2>&1; return 1; }
	e2e_run e2e_dkt 60 "$i" plugin rm -f "$ref"
}

# e2e_upgrade_publish: both releases in the registry, pushed from node 1's
# engine: the previous one from its plugin directory, this tree's with the
# Makefile's `make plugin-push REGISTRY=...` (by hand from build/plugin
# with E2E_SKIP_BUILD=1, where make would rebuild it).
e2e_upgrade_publish() {
	local to from_ref to_ref rc
	to=$(e2e_upgrade_to) || { log "no VERSION file: this tree's release is unknown"; return 1; }
	from_ref=$E2E_REGISTRY/$E2E_UPGRADE_REPO:$E2E_UPGRADE_FROM to_ref=$E2E_REGISTRY/$E2E_UPGRADE_REPO:$to
	[[ $from_ref != "$to_ref" ]] || { log "this tree's release is $to, the previous one's too"; return 1; }
	e2e_build_prev_plugin
	rc=$?
	((rc == 0)) || return "$rc"
	log "pushing $from_ref"
	e2e_push_plugin_dir 0 "$(e2e_prev_plugin_dir)" "$from_ref" || return 1
	if [[ ${E2E_SKIP_BUILD:-0} == 1 ]] || ! grep -q '^plugin-push:' "$E2E_ROOT/Makefile"; then
		log "pushing $to_ref from $E2E_ROOT/build/plugin"
		[[ ${E2E_SKIP_BUILD:-0} == 1 ]] || e2e_build_plugin || return 1
		e2e_push_plugin_dir 0 "$E2E_ROOT/build/plugin" "$to_ref" || return 1
	else
		log "make plugin-push REGISTRY=$E2E_REGISTRY"
		make -C "$E2E_ROOT" --no-print-directory plugin-push REGISTRY="$E2E_REGISTRY" DOCKER="${E2E_DOCKER[0]}" >&2 || return 1
		# Whatever the target leaves in the engine: the node starts fresh.
		e2e_dkt 60 0 plugin rm -f "$to_ref" >/dev/null 2>&1
	fi
	if ! e2e_registry_has "$E2E_UPGRADE_REPO" "$E2E_UPGRADE_FROM" || ! e2e_registry_has "$E2E_UPGRADE_REPO" "$to"; then
		log "the registry does not list both releases: $(e2e_registry_get "/v2/$E2E_UPGRADE_REPO/tags/list")"
		return 1
	fi
	E2E_UPGRADE_FROM_REF=$from_ref E2E_UPGRADE_TO_REF=$to_ref E2E_UPGRADE_TO=$to
	log "registry $E2E_REGISTRY: $(e2e_registry_get "/v2/$E2E_UPGRADE_REPO/tags/list")"
}

# ------------------------------------------------------------------ the check

ck_up_t() { date +%s.%N; }
ck_up_secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }

# ck_up_settings I: node I's install settings (E2E_UPGRADE_SETTINGS_FN).
ck_up_settings() { [[ -z $E2E_UPGRADE_SETTINGS_FN ]] || "$E2E_UPGRADE_SETTINGS_FN" "$1"; }

# ck_up_start_version I: the version in the last start-up line of node I's
# plugin ("overlay plugin starting version=..."), from dockerd's log.
ck_up_start_version() {
	ck_node_log "$1" | grep -E 'plugin=[0-9a-f]{64}' | grep -oE 'overlay plugin starting\\?"? version=[^ "\\]+' \
		| tail -n 1 | sed 's/.*version=//'
}

# ck_up_wait_start_version I WANT: the start-up line says WANT (dockerd logs
# the plugin's output a moment after it).
ck_up_wait_start_version() {
	local i=$1 want=$2 got end=$((SECONDS + 15 * ${E2E_TIME_SCALE:-1}))
	while got=$(ck_up_start_version "$i") && [[ $got != "$want" ]] && ((SECONDS < end)); do sleep 1; done
	[[ $got == "$want" ]] || { ck_fail "node $i: the plugin's start-up line says version '${got:-none}', want $want"; return 1; }
}

# ck_up_plugin_is I NAME REF: NAME on node I is enabled and comes from REF.
ck_up_plugin_is() {
	local got
	got=$(ck_dk "$1" plugin inspect -f '{{.Enabled}} {{.PluginReference}}' "$2" 2>&1)
	[[ $got == "true $3" ]] || { ck_fail "node $1: plugin $2: enabled/reference '$got', want 'true $3'"; return 1; }
}

# ck_up_rejections I WHEN: node I's gossip rejections (its metrics, counted
# since its plugin started). A refusal of a wire version, or of input that
# does not decode, is one release not understanding the other: it fails.
# stale, queue_full, ownership and owner_gone are routine, only shown.
ck_up_rejections() {
	local i=$1 when=$2 m bad all
	m=$(ck_metrics "$i") || { ck_fail "node $i ($when): no metrics on the admin socket"; return 1; }
	all=$(sed -nE 's/^overlay_plugin_gossip_rejected_total\{reason="([^"]+)"\} ([0-9.e+]+)$/\1=\2/p' <<<"$m")
	[[ -n $all ]] || { ck_fail "node $i ($when): no overlay_plugin_gossip_rejected_total in the metrics"; return 1; }
	bad=$(grep -vE '=0$' <<<"$all" | grep -vE '^(stale|queue_full|ownership|owner_gone)=' | tr '\n' ' ')
	ck_log "node $i ($when): gossip rejections: $(grep -vE '=0$' <<<"$all" | tr '\n' ' ')(reasons counted: $(cut -d= -f1 <<<"$all" | tr '\n' ' '))"
	[[ -z $bad ]] && return 0
	# The refusals' own log lines (rate-limited, so the first of each
	# reason is there) say what was refused and from whom.
	ck_node_log "$i" | grep -E 'refused|malformed|wire version' | tail -n 5 | sed 's/^/    | /' >&2
	ck_fail "node $i ($when): gossip input refused: $bad"
	return 1
}

# ck_up_members I N: node I's gossip sees N members alive.
ck_up_members() { grep -qxF "overlay_plugin_gossip_members_alive $2" <<<"$(ck_metrics "$1")"; }

# The README's commands, as an operator runs them: its Install section's
# `docker plugin install` (its flags, --alias NAME giving the plugin its name,
# and its settings, the reference replaced, the harness's settings added) and
# `docker plugin enable` when it installs --disable'd; its Upgrading
# section's disable, upgrade and enable (the reference replaced).
# ck_up_readme: sets CK_UP_INSTALL (the words before the reference),
# CK_UP_INSTALL_SET (the README's settings), CK_UP_NAME (the plugin's name,
# "" for the reference itself), CK_UP_ENABLE_AFTER (1: --disable) and
# CK_UP_UPGRADE (the three commands, the reference as @REF@).
ck_up_readme() {
	local cmd w seen=0
	local -a words
	cmd=$(ck_readme_cmds Install | grep -m1 '^docker plugin install ') \
		|| { ck_fail "README, Install: no docker plugin install command"; return 1; }
	read -ra words <<<"${cmd#docker }"
	CK_UP_INSTALL=() CK_UP_INSTALL_SET=() CK_UP_NAME='' CK_UP_ENABLE_AFTER=0
	for w in "${!words[@]}"; do
		if ((seen)); then
			CK_UP_INSTALL_SET+=("${words[w]}")
		elif [[ ${words[w]} == *"/$E2E_UPGRADE_REPO:"* ]]; then
			seen=1
		else
			CK_UP_INSTALL+=("${words[w]}")
			[[ ${words[w]} == --disable ]] && CK_UP_ENABLE_AFTER=1
			[[ ${words[w]} == --alias=* ]] && CK_UP_NAME=${words[w]#--alias=}
			((w > 0)) && [[ ${words[w - 1]} == --alias ]] && CK_UP_NAME=${words[w]}
		fi
	done
	((seen)) || { ck_fail "README, Install: no .../$E2E_UPGRADE_REPO:TAG reference in: $cmd"; return 1; }
	mapfile -t CK_UP_UPGRADE < <(ck_readme_cmds Upgrading | grep -E '^docker plugin (disable|upgrade|enable) ' \
		| sed -E "s#[^ ]*/$E2E_UPGRADE_REPO:[^ ]*#@REF@#")
	if ((${#CK_UP_UPGRADE[@]} != 3)) || [[ ${CK_UP_UPGRADE[0]} != "docker plugin disable "* ||
		${CK_UP_UPGRADE[1]} != "docker plugin upgrade "*" @REF@" || ${CK_UP_UPGRADE[2]} != "docker plugin enable "* ]]; then
		ck_fail "README, Upgrading: want docker plugin disable, upgrade (to .../$E2E_UPGRADE_REPO:TAG) and enable, found: ${CK_UP_UPGRADE[*]}"
		return 1
	fi
	ck_log "README: install: docker ${CK_UP_INSTALL[*]} REF ${CK_UP_INSTALL_SET[*]}$( ((CK_UP_ENABLE_AFTER)) && echo "; docker plugin enable ${CK_UP_NAME:-REF}")"
	ck_log "README: upgrade: $(printf '%s; ' "${CK_UP_UPGRADE[@]}")"
}

# ck_up_readme_cmd N NAME REF: the README's upgrade command N (0 disable,
# 1 upgrade, 2 enable) for plugin NAME and reference REF, as words, on
# stdout one a line (without "docker").
ck_up_readme_cmd() {
	local -a words
	local w readme_name
	read -ra words <<<"${CK_UP_UPGRADE[$1]#docker }"
	readme_name=${CK_UP_NAME:-$(ck_readme_plugin_name)}
	for w in "${words[@]}"; do
		case $w in
		@REF@) echo "$3" ;;
		"$readme_name") echo "$2" ;;
		*) echo "$w" ;;
		esac
	done
}

# ck_up_install I REF: REF installed on node I by the README's commands
# (ck_up_readme), with the harness's settings added; enabled.
ck_up_install() {
	local i=$1 ref=$2 name=${CK_UP_NAME:-$2} out
	local -a settings
	read -ra settings <<<"$(ck_up_settings "$i")"
	if [[ $ref == *":0.1.0" ]]; then
		# 0.1.0's 'netns' mount has the source /run/docker/netns, which Docker
		# creates only with the engine's first container (or swarm's ingress
		# sandbox): 0.1.0 cannot be enabled on a fresh engine (fixed by the
		# next release's 'run' mount). Its operators had to create it.
		# shellcheck disable=SC2016 # expanded by the node's sh
		ck_log "node $i: /run/docker/netns $(ck_hx "$i" sh -c 'test -d /run/docker/netns && echo "exists: [$(ls /run/docker/netns | tr "\n" " ")]"' || echo 'is missing: created for 0.1.0')"
		ck_hx "$i" mkdir -p /run/docker/netns || { ck_fail "node $i: mkdir /run/docker/netns"; return 1; }
	fi
	out=$(ck_dkt $((120 * ${E2E_TIME_SCALE:-1})) "$i" "${CK_UP_INSTALL[@]}" "$ref" "${CK_UP_INSTALL_SET[@]}" "${settings[@]}" 2>&1) \
		|| { ck_fail "node $i: docker ${CK_UP_INSTALL[*]} $ref: $out"; return 1; }
	if ((CK_UP_ENABLE_AFTER)); then
		out=$(ck_dkt $((60 * ${E2E_TIME_SCALE:-1})) "$i" plugin enable --timeout "${PLUGIN_ENABLE_TIMEOUT:-30}" "$name" 2>&1) \
			|| { ck_fail "node $i: docker plugin enable $name: $out"; return 1; }
	fi
	ck_up_plugin_is "$i" "$name" "$ref" || return 1
	ck_log "node $i: docker ${CK_UP_INSTALL[*]} $ref ${CK_UP_INSTALL_SET[*]} ${settings[*]}$( ((CK_UP_ENABLE_AFTER)) && echo "; enable $name"): enabled"
}

# ck_up_uninstall NAME: NAME removed from every node, and its state and
# sandbox directories emptied (the next install is a fresh one).
ck_up_uninstall() {
	local name=$1 i st sb
	for ((i = 0; i < CK_N; i++)); do
		st=$(ck_state_dir "$i" 2>/dev/null) sb=$(ck_sandbox_dir "$i" 2>/dev/null)
		ck_dk "$i" plugin inspect "$name" >/dev/null 2>&1 || continue
		ck_dkt 60 "$i" plugin rm -f "$name" >/dev/null 2>&1 || ck_log "node $i: plugin rm -f $name failed"
		# shellcheck disable=SC2016 # expanded by the node's sh
		[[ $st == /*/overlay-plugin ]] && ck_hx "$i" sh -c 'rm -rf "$1"/* "$1"/.[!.]*' _ "$st"
		[[ $sb == /*/netns ]] && ck_hx "$i" rmdir "$sb" 2>/dev/null
	done
	return 0
}

# ck_up_vip I CID: 10 requests from CID on node I to the service's VIP, by
# its name, answered by every task (task1..taskN), within 20 s.
ck_up_vip() {
	local i=$1 c=$2 got names want end=$((SECONDS + 20 * ${E2E_TIME_SCALE:-1}))
	want=$(for ((k = 1; k <= CK_N; k++)); do printf 'task%d ' "$k"; done)
	while :; do
		got=$(ck_vip_names "$i" "$c" "$CK_UP_SVC" 10)
		names=$(sed -E 's/\([0-9]+\)//g' <<<"$got" | tr ' ' '\n' | grep . | sort | tr '\n' ' ')
		[[ $names == "$want" ]] && { ck_log "node $i: 10 requests to $CK_UP_SVC (VIP): $got"; return 0; }
		((SECONDS < end)) || { ck_fail "node $i: 10 requests to $CK_UP_SVC (VIP) answered by [$got], want each of [$want]"; return 1; }
		sleep 1
	done
}

# ck_up_tasks I CID: tasks.<svc> resolves to every task from CID on node I,
# and each answers by its resolved address.
ck_up_tasks() {
	local i=$1 c=$2 names a body got=""
	names=$(ck_retry 15 ck_resolve_n "$i" "$c" "tasks.$CK_UP_SVC" "$CK_N") \
		|| { ck_fail "node $i: tasks.$CK_UP_SVC resolves to [$(tr '\n' ' ' <<<"$names")], want $CK_N addresses"; return 1; }
	for a in $names; do
		body=$(ck_get "$i" "$c" "$a") || { ck_fail "node $i: tasks.$CK_UP_SVC address $a: no answer"; return 1; }
		got+="$a=$body "
	done
	ck_log "node $i: tasks.$CK_UP_SVC -> $got"
}

# ck_up_new_container K PEER: after node K's upgrade, a new container on K
# and PEER's container (a node not upgraded yet, where there is one) reach
# each other by address, and the new one reaches the service by its VIP and
# through tasks.<svc>, PEER's by its VIP too.
ck_up_new_container() {
	local k=$1 p=$2 name="e2e-upn$1" nc nip body
	nc=$(ck_dk "$k" run -d --name "$name" --hostname "$name" --network "$CK_UP_NET" "$E2E_IMAGE" \
		sh -c "hostname >/www/index.html; exec httpd -f -p $CK_PORT -h /www" 2>&1) \
		|| { ck_fail "node $k: docker run --network $CK_UP_NET after the upgrade: $nc"; return 1; }
	CK_CONTAINERS+=("$k:$name")
	nip=$(ck_ip "$k" "$nc" "$CK_UP_NET")
	ck_log "node $k: new container $name at $nip; its peer: node $p's ${host[p]} at ${ip[p]}"
	body=$(ck_get "$k" "$nc" "${ip[p]}")
	[[ $body == "${host[p]}" ]] || { ck_fail "node $k's new container -> node $p (${ip[p]}): '${body:0:100}'"; return 1; }
	body=$(ck_get "$p" "${cid[p]}" "$nip")
	[[ $body == "$name" ]] || { ck_fail "node $p -> node $k's new container ($nip): '${body:0:100}'"; return 1; }
	ck_log "node $k's new container <-> node $p by address: ok"
	ck_up_vip "$k" "$nc" || return 1
	ck_up_tasks "$k" "$nc" || return 1
	ck_up_vip "$p" "${cid[p]}"
}

# The streams, between the containers of nodes 0 and 1 (cid, ip): node 0's
# pings node 1's five times a second (numbered: seq), node 1's sends node
# 0's a counter over one TCP connection every 200 ms (busybox nc), which
# node 0's logs. Marks are taken in the containers: the highest ping seq
# answered, the last number the TCP sender wrote.
ck_up_streams_start() {
	local out
	# shellcheck disable=SC2016 # expanded by the container's sh
	ck_dk 0 exec -d "${cid[0]}" sh -c 'echo $$ >/tmp/ping.pid; exec ping -i 0.2 "$1" >/tmp/ping.log 2>&1' sh "${ip[1]}" \
		|| { ck_fail "node 0: starting the ping stream"; return 1; }
	# The receiver's stdin stays open: busybox nc ends the connection at
	# its stdin's end, and docker exec -d gives it /dev/null.
	ck_dk 0 exec -d "${cid[0]}" sh -c "sleep 1000000 | nc -l -p $CK_UP_TCP_PORT >/tmp/tcp.rx 2>/tmp/tcp.rx.err" \
		|| { ck_fail "node 0: starting the TCP receiver"; return 1; }
	ck_retry 10 ck_dk 0 exec "${cid[0]}" sh -c "netstat -ltn | grep -q ':$CK_UP_TCP_PORT '" >/dev/null \
		|| { ck_fail "node 0: the TCP receiver does not listen"; return 1; }
	# shellcheck disable=SC2016 # expanded by the container's sh
	ck_dk 1 exec -d "${cid[1]}" sh -c 'i=0; while [ ! -e /tmp/tcp.stop ]; do echo $i; echo $i >/tmp/tcp.tx; i=$((i + 1)); sleep 0.2; done | nc "$1" "$2"; echo "nc exited $?" >/tmp/tcp.end' \
		sh "${ip[0]}" "$CK_UP_TCP_PORT" || { ck_fail "node 1: starting the TCP sender"; return 1; }
	out=$(ck_retry 10 ck_dk 0 exec "${cid[0]}" sh -c 'grep -q . /tmp/tcp.rx && grep -q "seq=" /tmp/ping.log') \
		|| { ck_fail "the streams do not flow: $out"; return 1; }
	ck_log "streams: node 0 (${ip[0]}) pings node 1 (${ip[1]}) every 0.2 s; node 1 sends node 0 a counter over TCP port $CK_UP_TCP_PORT every 0.2 s"
}

# ck_up_mark: "PING TCP", the stream positions now.
ck_up_mark() {
	local p t
	p=$(ck_dk 0 exec "${cid[0]}" sh -c "sed -nE 's/.* seq=([0-9]+) .*/\1/p' /tmp/ping.log | tail -n 1")
	t=$(ck_dk 1 exec "${cid[1]}" cat /tmp/tcp.tx 2>/dev/null)
	[[ -n $t ]] || { sleep 0.1; t=$(ck_dk 1 exec "${cid[1]}" cat /tmp/tcp.tx 2>/dev/null); }
	echo "${p:--1} ${t:--1}"
}

# ck_up_lost FILE A B: how many numbers in A+1..B are not lines of FILE.
ck_up_lost() {
	awk -v a="$2" -v b="$3" 'NR == FNR {got[$1 + 0] = 1; next} END {n = 0; for (k = a + 1; k <= b; k++) if (!(k in got)) n++; print n}' "$1" /dev/null
}

# ck_upgrade_roll ORDER...: one run: the previous release installed on every
# node, the workload, the streams, then every node upgraded in ORDER (node
# indexes), with the figures and the checks after each; the plugin removed
# again at the end.
ck_upgrade_roll() {
	local -a order=("$@") mp mt downs cid ip host
	local from_ref=$E2E_UPGRADE_FROM_REF to_ref=$E2E_UPGRADE_TO_REF i k p w out t0 t1 fails=0 oname
	local name=${CK_UP_NAME:-$E2E_UPGRADE_FROM_REF}
	# shellcheck disable=SC2034 # the plugin name of ck_mount_source & co.
	local E2E_PLUGIN=$name
	local -a cmd
	oname=$(for k in "${order[@]}"; do printf '%s,' "node$((k + 1))"; done)
	oname=${oname%,}
	ck_log "---- run order=$oname: $from_ref on every node, then $to_ref node by node"
	for ((i = 0; i < CK_N; i++)); do
		ck_up_install "$i" "$from_ref" || return 1
	done
	for ((i = 0; i < CK_N; i++)); do
		ck_up_wait_start_version "$i" "$E2E_UPGRADE_FROM" || return 1
	done
	ck_log "every node runs $E2E_UPGRADE_FROM (start-up line and PluginReference)"
	local -a opts=(--attachable)
	[[ ${E2E_EXPECT_ESP:-0} == 1 ]] && opts+=(--opt encrypted)
	ck_network "$CK_UP_NET" "$name" "${opts[@]}" || { ck_fail "network create -d $name: $CK_LAST_ERROR"; return 1; }
	CK_SERVICES+=("$CK_UP_SVC")
	out=$(ck_dk 0 service create -d --name "$CK_UP_SVC" --no-resolve-image --replicas "$CK_N" --replicas-max-per-node 1 \
		--network "$CK_UP_NET" --hostname 'task{{.Task.Slot}}' --stop-grace-period 1s "$E2E_IMAGE" \
		sh -c "hostname >/www/index.html; exec httpd -f -p $CK_PORT -h /www" 2>&1) \
		|| { ck_fail "service create $CK_UP_SVC: $out"; return 1; }
	ck_web_containers "$CK_UP_NET" e2e-upc || return 1
	ck_wait_tasks "$CK_UP_SVC" 1 || return 1
	ck_containers_mesh e2e-upc || return 1
	for ((i = 0; i < CK_N; i++)); do ck_up_vip "$i" "${cid[i]}" || return 1; done
	ck_up_streams_start || return 1
	sleep 3

	local -a upgraded=()
	for w in "${!order[@]}"; do
		k=${order[w]}
		ck_up_rejections "$k" "$E2E_UPGRADE_FROM, before its upgrade" || fails=1
		read -r "mp[w]" "mt[w]" <<<"$(ck_up_mark)"
		# The README's upgrade: disable, upgrade, enable.
		t0=$(ck_up_t)
		mapfile -t cmd < <(ck_up_readme_cmd 0 "$name" "$to_ref")
		out=$(ck_dkt 60 "$k" "${cmd[@]}" 2>&1) || { ck_fail "node $k: docker ${cmd[*]}: $out"; return 1; }
		mapfile -t cmd < <(ck_up_readme_cmd 1 "$name" "$to_ref")
		out=$(ck_dkt $((120 * ${E2E_TIME_SCALE:-1})) "$k" "${cmd[@]}" 2>&1) \
			|| { ck_fail "node $k: docker ${cmd[*]}: $out"; return 1; }
		# An upgrade replaces the plugin's whole config: every mount source
		# set before is back at the new release's default (the env settings
		# are kept): the harness's sources are set again before the enable.
		local -a srcs
		read -ra srcs <<<"$(ck_up_settings "$k" | tr ' ' '\n' | grep -E '^[a-z-]+\.source=' | tr '\n' ' ')"
		if ((${#srcs[@]})); then
			out=$(ck_dkt 60 "$k" plugin set "$name" "${srcs[@]}" 2>&1) \
				|| { ck_fail "node $k: plugin set ${srcs[*]} after the upgrade: $out"; return 1; }
		fi
		# (with the harness's time limit: an emulated VM starts slowly)
		mapfile -t cmd < <(ck_up_readme_cmd 2 "$name" "$to_ref")
		out=$(ck_dkt $((60 * ${E2E_TIME_SCALE:-1})) "$k" "${cmd[@]:0:2}" --timeout "${PLUGIN_ENABLE_TIMEOUT:-30}" "${cmd[@]:2}" 2>&1) \
			|| { ck_fail "node $k: docker ${cmd[*]} after the upgrade: $out"; return 1; }
		t1=$(ck_up_t)
		downs[w]=$(ck_up_secs "$t0" "$t1")
		ck_log "node $k: disable -f, upgrade to $to_ref${srcs:+, set ${srcs[*]}}, enable: down ${downs[w]} s"
		upgraded+=("$k")
		ck_up_plugin_is "$k" "$name" "$to_ref" || fails=1
		ck_up_wait_start_version "$k" "$E2E_UPGRADE_TO" || fails=1
		ck_retry 60 ck_up_members "$k" "$CK_N" >/dev/null \
			|| { ck_fail "node $k: its gossip does not see $CK_N members alive after the upgrade"; fails=1; }
		# The peer: the first node not upgraded yet, else another one.
		p=
		for i in "${order[@]}"; do [[ " ${upgraded[*]} " == *" $i "* ]] || { p=$i; break; }; done
		[[ -n $p ]] || p=${order[0]}
		[[ $p != "$k" ]] || p=${order[1]}
		ck_up_new_container "$k" "$p" || fails=1
		# The streams go on through the upgraded node for a while.
		sleep "$CK_UP_HOLD"
	done
	w=${#order[@]}
	read -r "mp[w]" "mt[w]" <<<"$(ck_up_mark)"
	sleep 2

	# Stop the streams; the ping's own count of what it sent, the TCP
	# sender's last number, and what arrived.
	local pinglog tcprx sent tcpend tcplast
	pinglog=$(mktemp) tcprx=$(mktemp)
	CK_FILES+=("$pinglog" "$tcprx")
	tcpend=$(ck_dk 1 exec "${cid[1]}" cat /tmp/tcp.end 2>/dev/null)
	[[ -z $tcpend ]] || { ck_fail "the TCP stream broke ($tcpend) at number $(ck_dk 1 exec "${cid[1]}" cat /tmp/tcp.tx)"; fails=1; }
	ck_dk 1 exec "${cid[1]}" touch /tmp/tcp.stop
	# shellcheck disable=SC2016 # expanded by the container's sh
	ck_dk 0 exec "${cid[0]}" sh -c 'kill -INT "$(cat /tmp/ping.pid)"'
	sleep 1
	ck_dk 0 exec "${cid[0]}" cat /tmp/ping.log >"$pinglog"
	sent=$(sed -nE 's/^([0-9]+) packets transmitted.*/\1/p' "$pinglog")
	[[ -n $sent ]] || { ck_fail "the ping stream has no summary: $(tail -n 3 "$pinglog" | tr '\n' ' ')"; return 1; }
	tcplast=$(ck_dk 1 exec "${cid[1]}" cat /tmp/tcp.tx)
	ck_dk 0 exec "${cid[0]}" cat /tmp/tcp.rx >"$tcprx"
	local pseq
	pseq=$(mktemp)
	CK_FILES+=("$pseq")
	sed -nE 's/.* seq=([0-9]+) .*/\1/p' "$pinglog" >"$pseq"
	# Windows: before (stream start .. first mark), node k (its mark .. the
	# next), after (last mark .. end; the ping's last packet left out: it may
	# be in flight when the ping is stopped).
	local -a wa wb wn
	wa=(-1) wb=("${mp[0]}") wn=(before)
	local -a ta tb
	ta=(-1) tb=("${mt[0]}")
	for w in "${!order[@]}"; do
		wa+=("${mp[w]}") wb+=("${mp[w + 1]}") ta+=("${mt[w]}") tb+=("${mt[w + 1]}") wn+=("node$((order[w] + 1))")
	done
	w=${#order[@]}
	wa+=("${mp[w]}") wb+=("$((sent - 2))") ta+=("${mt[w]}") tb+=("$tcplast") wn+=(after)
	local j pl tl psent tsent allowed line tp=0 tt=0 tps=0 tts=0
	for j in "${!wn[@]}"; do
		pl=$(ck_up_lost "$pseq" "${wa[j]}" "${wb[j]}") tl=$(ck_up_lost "$tcprx" "${ta[j]}" "${tb[j]}")
		psent=$((wb[j] - wa[j])) tsent=$((tb[j] - ta[j]))
		tp=$((tp + pl)) tt=$((tt + tl)) tps=$((tps + psent)) tts=$((tts + tsent))
		allowed=0 line="upgrade: order=$oname"
		if ((j == 0)); then
			line+=" window=before"
		elif ((j == ${#wn[@]} - 1)); then
			line+=" window=after"
		else
			allowed=$(awk -v d="${downs[j - 1]}" 'BEGIN {a = d * 5; printf "%d", (a == int(a)) ? a : int(a) + 1}')
			line+=" node=${wn[j]} down=${downs[j - 1]}s"
		fi
		line+=" ping_lost=$pl/$psent tcp_lost=$tl/$tsent allowed=$allowed"
		echo "$line"
		ck_log "$line"
		if ((pl > allowed || tl > allowed)); then
			ck_fail "order=$oname ${wn[j]}: ping lost $pl, TCP lost $tl; allowed $allowed (the packets sent while the node's own plugin was down)"
			fails=1
		fi
	done
	line="upgrade: order=$oname total ping_lost=$tp/$tps tcp_lost=$tt/$tts (ping: $sent sent by its own count)"
	echo "$line"
	ck_log "$line"

	# Every node runs the new release; no gossip input refused on any.
	for ((i = 0; i < CK_N; i++)); do
		ck_up_plugin_is "$i" "$name" "$to_ref" || fails=1
		[[ $(ck_up_start_version "$i") == "$E2E_UPGRADE_TO" ]] || { ck_fail "node $i: start-up line says $(ck_up_start_version "$i")"; fails=1; }
		out=$(ck_metrics "$i" | sed -nE 's/^overlay_plugin_build_info\{(.*)\} 1$/\1/p')
		if [[ -n $out ]]; then
			[[ $out == *"version=\"$E2E_UPGRADE_TO\""* ]] || { ck_fail "node $i: build_info {$out}, want version $E2E_UPGRADE_TO"; fails=1; }
		else
			ck_fail "node $i: no overlay_plugin_build_info in its metrics"
			fails=1
		fi
		ck_up_rejections "$i" "$E2E_UPGRADE_TO, after the roll" || fails=1
	done
	((fails)) || ck_log "order=$oname: every node runs $E2E_UPGRADE_TO (PluginReference $to_ref, start-up line, build_info), no gossip input refused"

	# The new release removes what the old one created.
	ck_remove
	if ck_dk 0 network inspect "$CK_UP_NET" >/dev/null 2>&1; then
		ck_fail "network rm $CK_UP_NET failed"
		fails=1
	fi
	# SAs go 20 s after the last endpoint towards a host (README,
	# Encryption); an emulated VM is slower (E2E_TIME_SCALE).
	for ((i = 0; i < CK_N; i++)); do ck_no_leftovers "$i" $((60 * ${E2E_TIME_SCALE:-1})) || fails=1; done
	return "$fails"
}

# check_upgrade CLI...: the rolling upgrade, in node order and then in the
# reverse order, each run from the previous release freshly installed
# (e2e_upgrade_publish has put both releases in the registry).
check_upgrade() {
	ck_nodes "$@"
	((CK_N >= 2)) || { ck_fail "needs two nodes at least"; return 1; }
	ck_have_hostx || { ck_fail "E2E_HOSTX is needed (the nodes' state and metrics)"; return 1; }
	[[ -n ${E2E_UPGRADE_FROM_REF:-} && -n ${E2E_UPGRADE_TO_REF:-} ]] || { ck_fail "the releases are not in a registry (e2e_upgrade_publish)"; return 1; }
	ck_up_readme || return 1
	trap 'ck_teardown; ck_up_uninstall "${CK_UP_NAME:-$E2E_UPGRADE_FROM_REF}"' EXIT
	local i fails=0
	local -a fwd rev
	for ((i = 0; i < CK_N; i++)); do fwd+=("$i") rev=("$i" "${rev[@]}"); done
	ck_upgrade_roll "${fwd[@]}" || fails=1
	# Whatever the first run left, the second starts from a fresh install.
	ck_remove
	ck_up_uninstall "${CK_UP_NAME:-$E2E_UPGRADE_FROM_REF}"
	ck_upgrade_roll "${rev[@]}" || fails=1
	return "$fails"
}
