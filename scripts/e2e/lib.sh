# shellcheck shell=bash
# scripts/e2e/lib.sh: a multi-node Docker swarm inside network namespaces on
# one machine, for scripts/e2e-docker.sh. Source it; it defines functions and
# sets nothing up by itself.
#
# Layout (nothing is added to the root network namespace):
#   <prefix>-sw        switch namespace: bridge br0, one veth port per node
#   <prefix>-n1..nN    one namespace per node: eth0 = 198.51.100.1<i>/24, no
#                      default route; its dockerd (and the containerd that
#                      dockerd starts, the plugin, the containers) run there
#   <prefix>-rg        the registry's namespace (e2e_registry_start):
#                      198.51.100.2:5000, plain HTTP, an insecure registry
#                      in every node's daemon.json
#   $E2E_TMP/n<i>/     data-root, logs of node i
#   /run/<prefix>-n<i>.sock   the node's docker API socket
# Each dockerd runs under `ip netns exec NS unshare --uts`, i.e. in a mount
# namespace of its own (a slave of the host's): its mounts never reach the
# host and disappear with its last process. It gets a tmpfs /sys/fs/cgroup
# with the host's cgroup hierarchies mounted again, private /etc/docker and
# /run/containerd, and tmpfs of its own where a host has per-host state:
# /run/docker (dockerd's default exec root: its plugin sockets and
# container namespaces, /run/docker/netns), /run/overlay-plugin (the
# plugin's sandboxes) and /var/lib/overlay-plugin (its state and admin
# socket); `/` made rshared (as on a systemd host) so a plugin's mounts
# reach it. So the plugin's own paths are the same on every node as on a
# host, and a fresh engine has no /run/docker/netns until its first
# container, as on a host.
#
# After e2e_setup: E2E_DOCKER[i] is the docker CLI of node i (a string to
# word-split), E2E_HOSTX[i] runs a command "on node i's host" (nsenter into
# its dockerd's mount, network and uts namespaces), i = 0..N-1.

E2E_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E_ROOT=$(cd "$E2E_LIB_DIR/../.." && pwd)

: "${E2E_NODES:=2}"
: "${E2E_PREFIX:=oe$$}"                 # namespace/socket name prefix
: "${E2E_UNDERLAY:=198.51.100}"         # /24 of the underlay; node i is .1<i>
: "${E2E_SWARM_POOL:=203.0.113.0/24}"   # swarm's address pool (overlay subnets)
: "${E2E_SWARM_POOL_MASK:=27}"
: "${E2E_DATA_PATH_PORT:=}"             # swarm init --data-path-port (empty: Docker's 4789)
: "${E2E_LOCAL_POOL:=198.18.0.0/16}"    # docker0/docker_gwbridge, per node
: "${E2E_DOCKER_CLI:=$(command -v /usr/bin/docker || command -v docker || echo docker)}"
: "${E2E_DOCKERD:=$(command -v dockerd || echo /usr/sbin/dockerd)}"
: "${E2E_IMAGE:=local/busybox:1}"
: "${E2E_DOCKERD_LOG_LEVEL:=info}"
: "${E2E_REGISTRY_ADDR:=$E2E_UNDERLAY.2}"  # the registry's namespace (e2e_registry_start)
: "${E2E_REGISTRY:=$E2E_REGISTRY_ADDR:5000}"

E2E_TMP=${E2E_TMP:-}
E2E_DOCKER=()
E2E_HOSTX=()
E2E_DOCKERD_PIDS=()
E2E_REGISTRY_PID=
# Host directories created as mount points (/var/lib/docker, ...) are shared
# by every harness run on the host: each mounts its own tmpfs over them in its
# nodes' mount namespaces, and removing one while another run uses it would
# silently detach that run's mounts. Every run holds _E2E_LOCK shared; the
# directories created (listed in _E2E_LOCK.dirs) go with the last run out.
_E2E_LOCK=/run/overlay-plugin-e2e.lock
_E2E_LOCK_FD=
_E2E_NETNS=()
_E2E_CLEANED=0

# ---------------------------------------------------------------- logging

e2e_ts() { date -u +%H:%M:%S.%3N; }
log() { printf '%s [e2e] %s\n' "$(e2e_ts)" "$*" >&2; }
warn() { printf '%s [e2e] WARN: %s\n' "$(e2e_ts)" "$*" >&2; }
die() { printf '%s [e2e] FATAL: %s\n' "$(e2e_ts)" "$*" >&2; exit 1; }

# e2e_run CMD...: log a command, run it, and log its output on failure.
e2e_run() {
	local out rc
	out=$("$@" 2>&1) && rc=0 || rc=$?
	if ((rc)); then
		log "command failed (rc=$rc): $*"
		[[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/    | /' >&2
	fi
	return "$rc"
}

# e2e_wait SECONDS DESCRIPTION CMD...: poll CMD every 0.5 s until it succeeds,
# for SECONDS times E2E_TIME_SCALE (1; more where everything is slower, as
# under emulation).
e2e_wait() {
	local limit=$(($1 * ${E2E_TIME_SCALE:-1})) what=$2; shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= end)); then
			log "timed out after ${limit}s waiting for: $what"
			return 1
		fi
		sleep 0.5
	done
}

# ---------------------------------------------------------------- packages

# e2e_install_packages: install what the harness needs from Debian, if
# missing (apt-get update once, only when something is missing).
e2e_install_packages() {
	local -A need=([dockerd]=docker.io [containerd]=containerd [runc]=runc [iptables]=iptables
		[ip]=iproute2 [nsenter]=util-linux [unshare]=util-linux [jq]=jq [tcpdump]=tcpdump [curl]=curl
		[docker-registry]=docker-registry)
	local missing=() c
	for c in "${!need[@]}"; do
		command -v "$c" >/dev/null || missing+=("${need[$c]}")
	done
	# busybox-static: the test image needs a static busybox.
	if ! dpkg -s busybox-static >/dev/null 2>&1; then missing+=(busybox-static); fi
	[[ -x /usr/bin/docker ]] || missing+=(docker.io)
	((${#missing[@]})) || { log "packages: all present"; return 0; }
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	log "installing from Debian: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=400 update -qq >&2 || die "apt-get update failed"
	apt-get install -y -q -o DPkg::Lock::Timeout=400 --no-install-recommends "${missing[@]}" >&2 \
		|| die "apt-get install ${missing[*]} failed"
	E2E_DOCKER_CLI=$(command -v /usr/bin/docker || command -v docker)
	E2E_DOCKERD=$(command -v dockerd)
}

# e2e_build_plugin: bin/overlay-plugin (make build), build/plugin, and the
# Go checks' test binary (e2e_build_gotest).
e2e_build_plugin() {
	if [[ ${E2E_SKIP_BUILD:-0} == 1 && -f $E2E_ROOT/build/plugin/config.json ]]; then
		log "E2E_SKIP_BUILD=1: using $E2E_ROOT/build/plugin and $E2E_ROOT/build/e2e as they are"
		return 0
	fi
	log "make build"
	make -C "$E2E_ROOT" build >&2 || return 1
	bash "$E2E_ROOT/plugin/build.sh" "$E2E_ROOT/build/plugin" || return 1
	e2e_build_gotest
}

# e2e_build_gotest: test/dockere2e's test binary, the checks ported to Go
# (scripts/e2e/checks.sh, E2E_GO_CHECKS), in build/e2e; static, so that the
# test VM, which has no Go, runs it as it runs the other binaries.
e2e_build_gotest() {
	log "go test -c ./test/dockere2e"
	mkdir -p "$E2E_ROOT/build/e2e"
	(cd "$E2E_ROOT" && CGO_ENABLED=0 go test -c -o build/e2e/dockere2e.test ./test/dockere2e) >&2
}

# ---------------------------------------------------------------- helpers

# e2e_dk I ARGS...: docker CLI of node I (0-based).
e2e_dk() {
	local i=$1; shift
	local -a c
	read -ra c <<<"${E2E_DOCKER[$i]}"
	"${c[@]}" "$@"
}

# e2e_dkt SECONDS I ARGS...: e2e_dk under a time limit.
e2e_dkt() {
	local t=$1 i=$2; shift 2
	local -a c
	read -ra c <<<"${E2E_DOCKER[$i]}"
	timeout "$t" "${c[@]}" "$@"
}

# e2e_hx I CMD...: run CMD on node I's "host" (its dockerd's namespaces).
e2e_hx() {
	local i=$1; shift
	local -a c
	read -ra c <<<"${E2E_HOSTX[$i]}"
	"${c[@]}" "$@"
}

e2e_node_ns() { echo "$E2E_PREFIX-n$(($1 + 1))"; }
e2e_node_name() { echo "node$(($1 + 1))"; }
e2e_node_addr() { echo "$E2E_UNDERLAY.1$(($1 + 1))"; }
e2e_node_dir() { echo "$E2E_TMP/n$(($1 + 1))"; }
e2e_node_sock() { echo "/run/$E2E_PREFIX-n$(($1 + 1)).sock"; }
e2e_switch_ns() { echo "$E2E_PREFIX-sw"; }
# e2e_switch_port I: node I's port on br0, in the switch namespace.
e2e_switch_port() { echo "p$(($1 + 1))"; }

# _e2e_mountpoint_dir DIR: make sure DIR exists (to mount over it in a node's
# mount namespace); remember it for removal at cleanup if we created it.
_e2e_mountpoint_dir() {
	if [[ -z $_E2E_LOCK_FD ]]; then
		exec {_E2E_LOCK_FD}>>"$_E2E_LOCK"
		flock -s "$_E2E_LOCK_FD"
	fi
	[[ -d $1 ]] && return 0
	mkdir -p "$1"
	echo "$1" >>"$_E2E_LOCK.dirs"
}

# _e2e_release_mountpoint_dirs: the last run out removes the directories
# the runs created (see _E2E_LOCK).
_e2e_release_mountpoint_dirs() {
	[[ -n $_E2E_LOCK_FD ]] || return 0
	if flock -x -n "$_E2E_LOCK_FD"; then
		if [[ -f $_E2E_LOCK.dirs ]]; then
			tac "$_E2E_LOCK.dirs" | while read -r d; do rmdir "$d" 2>/dev/null; done
			rm -f "$_E2E_LOCK.dirs"
		fi
	fi
	exec {_E2E_LOCK_FD}>&-
	_E2E_LOCK_FD=
}

# ---------------------------------------------------------------- topology

e2e_make_tmp() {
	[[ -n $E2E_TMP ]] && return 0
	E2E_TMP=$(mktemp -d "${TMPDIR:-/tmp}/oe.XXXXXX")
	chmod 755 "$E2E_TMP"
	log "run directory $E2E_TMP"
}

# e2e_topology: the switch namespace and E2E_NODES node namespaces.
e2e_topology() {
	local sw i ns p
	sw=$(e2e_switch_ns)
	log "creating namespaces: $sw and $E2E_NODES nodes on $E2E_UNDERLAY.0/24"
	ip netns add "$sw" || die "ip netns add $sw"
	_E2E_NETNS+=("$sw")
	ip -n "$sw" link set lo up
	ip -n "$sw" link add br0 type bridge
	ip -n "$sw" link set br0 up
	for ((i = 0; i < E2E_NODES; i++)); do
		ns=$(e2e_node_ns "$i")
		ip netns add "$ns" || die "ip netns add $ns"
		_E2E_NETNS+=("$ns")
		ip -n "$ns" link set lo up
		# Both ends are created inside our namespaces, never in the root one.
		p=$(e2e_switch_port "$i")
		ip -n "$sw" link add "$p" type veth peer name eth0 netns "$ns"
		ip -n "$sw" link set "$p" master br0 up
		ip -n "$ns" addr add "$(e2e_node_addr "$i")/24" dev eth0
		ip -n "$ns" link set eth0 up
		ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
	done
	for ((i = 1; i < E2E_NODES; i++)); do
		e2e_wait 10 "underlay ping node1 -> node$((i + 1))" \
			ip netns exec "$(e2e_node_ns 0)" busybox ping -c1 -W1 "$(e2e_node_addr "$i")" || die "underlay is not working"
	done
	log "underlay up"
	# Every node's underlay traffic crosses br0: the checks' capture point
	# (test/dockere2e, wire.go; scripts/e2e/checks.sh passes it on).
	# shellcheck disable=SC2034 # read by checks.sh, sourced beside this file
	E2E_WIRE_NETNS=$sw E2E_WIRE_IF=br0
}

# ---------------------------------------------------------------- dockerd

# _e2e_cgroup_specs: the host's cgroup mounts as "fstype mountpoint options"
# lines, read from /proc/self/mountinfo before entering a node (ip netns exec
# replaces /sys and hides them).
_e2e_cgroup_specs() {
	awk '{
		for (i = 7; $i != "-"; i++) {}
		fstype = $(i + 1); opts = $(i + 3); mp = $5
		if ((fstype == "cgroup" || fstype == "cgroup2") && index(mp, "/sys/fs/cgroup") == 1) {
			n = split(opts, o, ","); keep = ""
			for (j = 1; j <= n; j++) if (o[j] != "rw" && o[j] != "ro") keep = keep (keep == "" ? "" : ",") o[j]
			print fstype, mp, (keep == "" ? "-" : keep)
		}
	}' /proc/self/mountinfo
}

# _e2e_node_launcher NAME DIR CGROUP_SPECS DOCKERD ARGS...: runs inside
# `ip netns exec NS unshare --uts`; prepares the mount namespace and execs
# dockerd. Defined here and passed to bash -c with declare -f.
_e2e_node_launcher() {
	set -e
	local name=$1 dir=$2 specs=$3; shift 3
	hostname "$name"
	# -n everywhere: no /run/mount/utab on the host.
	# As on a systemd host: shared propagation inside this namespace (it stays
	# a slave of the host's, so nothing mounted here reaches the host).
	mount -n --make-rshared /
	if grep -q '^cgroup2 /sys/fs/cgroup ' <<<"$specs"; then
		mount -n -t cgroup2 cgroup2 /sys/fs/cgroup
	else
		mount -n -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
		local fstype mp opts
		while read -r fstype mp opts; do
			[[ -n $fstype ]] || continue
			mkdir -p "$mp"
			[[ $opts == - ]] && opts=
			mount -n -t "$fstype" ${opts:+-o "$opts"} "$fstype" "$mp" \
				|| mount -n -t "$fstype" "$fstype" "$mp"
		done <<<"$specs"
	fi
	# Private copies of the paths dockerd and containerd use whatever their
	# --data-root: /etc/docker (key.json), /run/containerd (so this dockerd
	# starts its own containerd even if the host runs one; shim sockets),
	# /run/docker (the exec root: plugin sockets, Docker's container
	# namespaces in /run/docker/netns), /var/lib/docker (libnetwork's
	# load-balancer files), /opt/containerd (containerd's plugin dirs), and
	# the plugin's host directories /run/overlay-plugin (its sandboxes) and
	# /var/lib/overlay-plugin (state.db, admin.sock). Each a tmpfs of its
	# own, as /run is on a host: not the mount of Docker's data root, which
	# runc makes private in the plugin's mount namespace, so the namespaces
	# mounted there propagate between the plugin and the node.
	mount -n --bind "$dir/etc-docker" /etc/docker
	local d
	for d in /run/containerd /run/docker /var/lib/docker /opt/containerd /run/overlay-plugin /var/lib/overlay-plugin; do
		mount -n -t tmpfs -o mode=711 tmpfs "$d"
	done
	exec "$@"
}

# e2e_start_dockerd I: start node I's dockerd (in the background).
e2e_start_dockerd() {
	local i=$1 ns dir sock name specs
	ns=$(e2e_node_ns "$i") dir=$(e2e_node_dir "$i") sock=$(e2e_node_sock "$i") name=$(e2e_node_name "$i")
	mkdir -p "$dir/data" "$dir/etc-docker"
	# The run's registry (e2e_registry_start) speaks plain HTTP.
	printf '{"insecure-registries": ["%s"]}\n' "$E2E_REGISTRY" >"$dir/daemon.json"
	local d
	for d in /etc/docker /run/containerd /run/docker /var/lib/docker /opt/containerd /run/overlay-plugin /var/lib/overlay-plugin; do
		_e2e_mountpoint_dir "$d"
	done
	specs=$(_e2e_cgroup_specs)
	[[ -n $specs ]] || warn "no cgroup mounts found on the host"
	log "starting dockerd $name in $ns (socket $sock, log $dir/dockerd.log)"
	ip netns exec "$ns" unshare --uts -- bash -c "$(declare -f _e2e_node_launcher); _e2e_node_launcher \"\$@\"" \
		launcher "$name" "$dir" "$specs" \
		"$E2E_DOCKERD" --data-root "$dir/data" -H "unix://$sock" \
		--pidfile "$dir/dockerd.pid" --config-file "$dir/daemon.json" \
		--default-address-pool "base=$E2E_LOCAL_POOL,size=24" \
		--log-level "$E2E_DOCKERD_LOG_LEVEL" \
		>"$dir/dockerd.log" 2>&1 &
	E2E_DOCKERD_PIDS[i]=$!   # bash -c execs dockerd: the same PID
	E2E_DOCKER[i]="$E2E_DOCKER_CLI -H unix://$sock"
	E2E_HOSTX[i]="nsenter -t ${E2E_DOCKERD_PIDS[i]} -m -n -u --"
}

# e2e_wait_dockerd I: wait until node I's daemon answers.
e2e_wait_dockerd() {
	local i=$1
	if ! e2e_wait 60 "dockerd $(e2e_node_name "$i")" e2e_dk "$i" version; then
		e2e_dump_logs 40
		die "dockerd $(e2e_node_name "$i") did not come up"
	fi
	kill -0 "${E2E_DOCKERD_PIDS[i]}" 2>/dev/null || die "dockerd $(e2e_node_name "$i") exited"
	log "dockerd $(e2e_node_name "$i") ready (pid ${E2E_DOCKERD_PIDS[i]}, $(e2e_dk "$i" version -f '{{.Server.Version}}'))"
}

e2e_start_nodes() {
	local i
	for ((i = 0; i < E2E_NODES; i++)); do e2e_start_dockerd "$i"; done
	for ((i = 0; i < E2E_NODES; i++)); do e2e_wait_dockerd "$i"; done
}

# ---------------------------------------------------------------- swarm

_e2e_nodes_ready() {
	local n
	n=$(e2e_dk 0 node ls --format '{{.Status}}' | grep -c '^Ready$')
	((n == E2E_NODES))
}

# e2e_swarm: node 1 is the manager, the others workers; explicit addresses.
e2e_swarm() {
	local i token addr
	addr=$(e2e_node_addr 0)
	local port=()
	[[ -z $E2E_DATA_PATH_PORT ]] || port=(--data-path-port "$E2E_DATA_PATH_PORT")
	log "swarm init on $(e2e_node_name 0) ($addr), address pool $E2E_SWARM_POOL/$E2E_SWARM_POOL_MASK, data-path port ${E2E_DATA_PATH_PORT:-4789}"
	e2e_run e2e_dk 0 swarm init --advertise-addr "$addr" --listen-addr "$addr:2377" \
		--default-addr-pool "$E2E_SWARM_POOL" --default-addr-pool-mask-length "$E2E_SWARM_POOL_MASK" "${port[@]}" \
		|| die "swarm init failed"
	token=$(e2e_dk 0 swarm join-token -q worker)
	for ((i = 1; i < E2E_NODES; i++)); do
		addr=$(e2e_node_addr "$i")
		log "swarm join $(e2e_node_name "$i") ($addr)"
		e2e_run e2e_dk "$i" swarm join --token "$token" --advertise-addr "$addr" --listen-addr "$addr:2377" \
			"$(e2e_node_addr 0):2377" || die "swarm join failed"
	done
	e2e_wait 60 "all $E2E_NODES swarm nodes Ready" _e2e_nodes_ready || {
		e2e_dk 0 node ls >&2
		die "swarm did not form"
	}
	log "swarm ready: $(e2e_dk 0 node ls --format '{{.Hostname}}={{.Status}}/{{.ManagerStatus}}' | tr '\n' ' ')"
}

# ---------------------------------------------------------------- image

# e2e_build_image: a busybox image from Debian's busybox-static (every applet
# linked), imported on each node as $E2E_IMAGE. No registry involved.
e2e_build_image() {
	local rootfs="$E2E_TMP/image-rootfs" tar="$E2E_TMP/busybox.tar" i a bb
	bb=$(command -v busybox) || die "busybox not found"
	[[ $bb == /bin/busybox || $bb == /usr/bin/busybox ]] || true
	mkdir -p "$rootfs"/{bin,etc,tmp,www,proc,sys,dev,root}
	chmod 1777 "$rootfs/tmp"
	cp "$bb" "$rootfs/bin/busybox"
	# One process for its ~270 applet links (-> /bin/busybox inside the
	# image), not one ln each: a process start costs ~0.1 s in the test VM.
	chroot "$rootfs" /bin/busybox --install -s /bin || die "busybox --install in $rootfs failed"
	for a in timeout nc httpd wget ping nslookup sh; do
		[[ -e $rootfs/bin/$a ]] || die "busybox lacks the $a applet"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
	tar -C "$rootfs" -cf "$tar" .
	for ((i = 0; i < E2E_NODES; i++)); do
		e2e_run e2e_dk "$i" import --change 'CMD ["sh"]' --change 'ENV PATH=/bin' "$tar" "$E2E_IMAGE" \
			|| die "docker import on $(e2e_node_name "$i") failed"
	done
	log "image $E2E_IMAGE imported on $E2E_NODES nodes"
}

# ---------------------------------------------------------------- plugin

# e2e_secret: the run's cluster secret, the same for every node, in a
# directory per node ($E2E_TMP/secrets/NODE/secret, the node's 'secrets'
# mount source): a check may change one node's (the secret's roll).
e2e_secret() {
	local i d
	mkdir -p "$E2E_TMP/secrets"
	chmod 700 "$E2E_TMP/secrets"
	[[ -f $E2E_TMP/secrets/secret ]] || head -c 32 /dev/urandom | base64 >"$E2E_TMP/secrets/secret"
	chmod 600 "$E2E_TMP/secrets/secret"
	for ((i = 0; i < E2E_NODES; i++)); do
		d=$E2E_TMP/secrets/$(e2e_node_name "$i")
		[[ -f $d/secret ]] && continue
		install -d -m 700 "$d"
		install -m 600 "$E2E_TMP/secrets/secret" "$d/secret"
	done
}

# e2e_plugin_settings I: node I's plugin settings (K=V ..., for `docker
# plugin set` or `docker plugin install`): the mount sources that differ
# from a host's, the run's secret directory and the node's own engine
# socket, a log level and the node's name, then E2E_PLUGIN_SETTINGS. The
# plugin's other host paths (/run, /var/lib) are the node's own already.
e2e_plugin_settings() {
	e2e_secret
	echo "secrets.source=$E2E_TMP/secrets/$(e2e_node_name "$1") docker.source=$(e2e_node_sock "$1") OVERLAY_LOG_LEVEL=${E2E_PLUGIN_LOG_LEVEL:-debug} OVERLAY_NODE_NAME=$(e2e_node_name "$1") ${E2E_PLUGIN_SETTINGS:-}"
}
# shellcheck disable=SC2034 # read by upgrade.sh
E2E_UPGRADE_SETTINGS_FN=e2e_plugin_settings

# e2e_install_plugin NAME: the plugin installed as NAME on every node by the
# README's install command (ck_readme_install_cmd, scripts/e2e/checks.sh: make
# plugin-install PLUGIN_NAME=NAME) run as written in the checkout, with the
# node's docker CLI in DOCKER and its settings (e2e_plugin_settings) in
# PLUGIN_SETTINGS, which plugin/install.sh reads. With E2E_SKIP_BUILD=1 or
# E2E_PLUGIN_DIR, plugin/install.sh is run directly (make would rebuild
# build/plugin).
e2e_install_plugin() {
	local name=$1 i cmd direct=0
	e2e_secret
	[[ ${E2E_SKIP_BUILD:-0} == 1 || -n ${E2E_PLUGIN_DIR:-} ]] && direct=1
	if ((!direct)); then
		cmd=$(ck_readme_install_cmd) || { log "README.md has no 'make plugin-install' command"; return 1; }
		[[ $(ck_readme_plugin_name) == "$name" ]] || { log "the README installs $(ck_readme_plugin_name), not $name"; return 1; }
	fi
	for ((i = 0; i < E2E_NODES; i++)); do
		(
			PLUGIN_SETTINGS=$(e2e_plugin_settings "$i")
			export DOCKER="${E2E_DOCKER[i]}" PLUGIN_DIR="${E2E_PLUGIN_DIR:-$E2E_ROOT/build/plugin}" PLUGIN_SETTINGS
			cd "$E2E_ROOT" || exit 1
			if ((direct)); then
				bash plugin/install.sh "$name"
			else
				log "$(e2e_node_name "$i"): $cmd"
				eval "$cmd"
			fi
		) >&2 || return 1
	done
}

# e2e_plugin_log I [LINES]: the plugin's lines in node I's dockerd log.
e2e_plugin_log() {
	local i=$1 n=${2:-60}
	grep -E 'plugin=[0-9a-f]{64}' "$(e2e_node_dir "$i")/dockerd.log" | tail -n "$n" \
		| sed -E 's/^time="[^"]*" level=[a-z]+ msg="//; s/" plugin=[0-9a-f]{64}$//; s/\\"/"/g'
}

# ---------------------------------------------------------------- registry

e2e_registry_ns() { echo "$E2E_PREFIX-rg"; }

# e2e_registry_get PATH: GET http://$E2E_REGISTRY/PATH, from the registry's
# own namespace.
e2e_registry_get() {
	ip netns exec "$(e2e_registry_ns)" curl -sf --max-time 10 "http://$E2E_REGISTRY$1"
}

# e2e_registry_has REPO TAG: the registry lists TAG of REPO.
e2e_registry_has() {
	e2e_registry_get "/v2/$1/tags/list" | jq -e --arg t "$2" '.tags | index($t)' >/dev/null
}

# e2e_registry_start: Debian's docker-registry (distribution 2.8) in a
# namespace of its own on the underlay ($E2E_REGISTRY_ADDR, a port on the
# switch's br0), plain HTTP, its storage in $E2E_TMP/registry. Every node
# lists it in insecure-registries (e2e_start_dockerd).
e2e_registry_start() {
	local ns sw dir
	ns=$(e2e_registry_ns) sw=$(e2e_switch_ns) dir=$E2E_TMP/registry
	[[ -n $E2E_TMP ]] || { log "no run directory"; return 1; }
	command -v docker-registry >/dev/null || { log "docker-registry is not installed"; return 1; }
	ip netns add "$ns" || return 1
	_E2E_NETNS+=("$ns")
	ip -n "$ns" link set lo up
	ip -n "$sw" link add prg type veth peer name eth0 netns "$ns"
	ip -n "$sw" link set prg master br0 up
	ip -n "$ns" addr add "$E2E_REGISTRY_ADDR/24" dev eth0
	ip -n "$ns" link set eth0 up
	mkdir -p "$dir/data"
	cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/data
http:
  addr: $E2E_REGISTRY
EOF
	ip netns exec "$ns" docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
	E2E_REGISTRY_PID=$!   # ip netns exec execs it: the same PID
	if ! e2e_wait 30 "registry on $E2E_REGISTRY" e2e_registry_get /v2/; then
		sed 's/^/    | /' "$dir/registry.log" >&2
		return 1
	fi
	log "registry $E2E_REGISTRY up (pid $E2E_REGISTRY_PID, namespace $ns, storage $dir/data)"
}

# e2e_registry_stop: the registry stopped by its PID, its storage and
# namespace removed.
e2e_registry_stop() {
	local ns end n
	ns=$(e2e_registry_ns)
	if [[ -n $E2E_REGISTRY_PID ]]; then
		kill -TERM "$E2E_REGISTRY_PID" 2>/dev/null
		end=$((SECONDS + 10))
		while kill -0 "$E2E_REGISTRY_PID" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
		kill -KILL "$E2E_REGISTRY_PID" 2>/dev/null
		wait "$E2E_REGISTRY_PID" 2>/dev/null
		log "registry stopped (pid $E2E_REGISTRY_PID)"
		E2E_REGISTRY_PID=
	fi
	[[ -n $E2E_TMP ]] && rm -rf "$E2E_TMP/registry"
	if grep -qxF "$ns" <<<"$(ip netns list | awk '{print $1}')"; then
		ip netns del "$ns" || warn "ip netns del $ns failed"
	fi
	local -a keep=()
	for n in "${_E2E_NETNS[@]}"; do [[ $n == "$ns" ]] || keep+=("$n"); done
	_E2E_NETNS=("${keep[@]}")
}

# ---------------------------------------------------------------- diagnostics

e2e_dump_logs() {
	local i n=${1:-40} dir
	for ((i = 0; i < ${#E2E_DOCKERD_PIDS[@]}; i++)); do
		dir=$(e2e_node_dir "$i")
		[[ -f $dir/dockerd.log ]] || continue
		log "---- $(e2e_node_name "$i"): last $n lines of dockerd.log (without plugin lines) ----"
		grep -vE 'plugin=[0-9a-f]{64}' "$dir/dockerd.log" | tail -n "$n" | sed 's/^/    | /' >&2
		if grep -qE 'plugin=[0-9a-f]{64}' "$dir/dockerd.log"; then
			log "---- $(e2e_node_name "$i"): last $n plugin log lines ----"
			e2e_plugin_log "$i" "$n" | sed 's/^/    | /' >&2
		fi
	done
}

# ---------------------------------------------------------------- cleanup

# _e2e_descendants PID...: the PIDs and all their descendants.
_e2e_descendants() {
	local -a todo=("$@") out=() kids
	local p
	while ((${#todo[@]})); do
		p=${todo[0]}; todo=("${todo[@]:1}")
		out+=("$p")
		mapfile -t kids < <(pgrep -P "$p" 2>/dev/null)
		todo+=("${kids[@]}")
	done
	printf '%s\n' "${out[@]}"
}

# _e2e_ns_pids NS: every process in network namespace NS and its descendants
# (containers live in namespaces of their own under the shims).
_e2e_ns_pids() {
	local -a p
	mapfile -t p < <(ip netns pids "$1" 2>/dev/null)
	((${#p[@]})) || return 0
	_e2e_descendants "${p[@]}" | sort -un
}

_e2e_kill_pids() {   # SIG PID...
	local sig=$1 p; shift
	for p in "$@"; do kill "-$sig" "$p" 2>/dev/null || true; done
}

# e2e_stop_node I: remove containers, leave the swarm, stop dockerd by PID
# (it stops its containerd), then anything left in the node namespace.
e2e_stop_node() {
	local i=$1 pid=${E2E_DOCKERD_PIDS[$1]:-} ns end left
	ns=$(e2e_node_ns "$i")
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		local -a ids
		mapfile -t ids < <(e2e_dkt 10 "$i" ps -aq 2>/dev/null)
		((${#ids[@]} == 0)) || e2e_dkt 30 "$i" rm -f "${ids[@]}" >/dev/null 2>&1
		e2e_dkt 20 "$i" swarm leave --force >/dev/null 2>&1
		local pl
		for pl in $(e2e_dkt 10 "$i" plugin ls -q 2>/dev/null); do
			e2e_dkt 30 "$i" plugin rm -f "$pl" >/dev/null 2>&1
		done
		log "stopping dockerd $(e2e_node_name "$i") (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		end=$((SECONDS + 30))
		while kill -0 "$pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.3; done
		if kill -0 "$pid" 2>/dev/null; then
			warn "dockerd $pid still running after 30 s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	# Whatever outlived it in the node namespace (containerd, shims, plugin,
	# containers): all started by this run, killed by PID.
	mapfile -t left < <(_e2e_ns_pids "$ns")
	if ((${#left[@]})); then
		log "$(e2e_node_name "$i"): terminating ${#left[@]} leftover process(es): $(ps -o pid=,comm= -p "$(IFS=,; echo "${left[*]}")" | tr -s ' \n' ' ')"
		_e2e_kill_pids TERM "${left[@]}"
		end=$((SECONDS + 10))
		while ((SECONDS < end)); do
			mapfile -t left < <(_e2e_ns_pids "$ns")
			((${#left[@]})) || break
			sleep 0.3
		done
		((${#left[@]})) && _e2e_kill_pids KILL "${left[@]}"
	fi
}

# e2e_cleanup: idempotent; safe at any stage of setup.
e2e_cleanup() {
	((_E2E_CLEANED)) && return 0
	_E2E_CLEANED=1
	set +e
	log "cleanup"
	local i ns d
	# Services and networks first (manager), so the plugins see their teardown.
	local -a svcs
	if ((${#E2E_DOCKER[@]})) && e2e_dkt 10 0 info >/dev/null 2>&1; then
		mapfile -t svcs < <(e2e_dkt 10 0 service ls -q 2>/dev/null)
		((${#svcs[@]} == 0)) || e2e_dkt 30 0 service rm "${svcs[@]}" >/dev/null 2>&1
	fi
	for ((i = ${#E2E_DOCKERD_PIDS[@]} - 1; i >= 0; i--)); do
		e2e_stop_node "$i"
	done
	e2e_registry_stop
	for ((i = 0; i < E2E_NODES; i++)); do
		ns=$(e2e_node_ns "$i")
		ip netns pids "$ns" >/dev/null 2>&1 && [[ -n $(_e2e_ns_pids "$ns") ]] && e2e_stop_node "$i"
	done
	for ((i = ${#_E2E_NETNS[@]} - 1; i >= 0; i--)); do
		ip netns del "${_E2E_NETNS[i]}" 2>/dev/null || warn "ip netns del ${_E2E_NETNS[i]} failed"
	done
	for ((i = 0; i < E2E_NODES; i++)); do rm -f "$(e2e_node_sock "$i")"; done
	_e2e_release_mountpoint_dirs
	if [[ -n $E2E_TMP && -d $E2E_TMP ]]; then
		if grep -qF "$E2E_TMP" <<<"$(findmnt -rn -o TARGET)"; then
			warn "mounts left under $E2E_TMP: $(findmnt -rn -o TARGET | grep -F "$E2E_TMP" | tr '\n' ' ')"
			findmnt -rn -o TARGET | grep -F "$E2E_TMP" | sort -r | while read -r d; do umount -l "$d"; done
		fi
		if [[ -n ${E2E_KEEP_TMP:-} ]]; then
			log "keeping $E2E_TMP (E2E_KEEP_TMP set)"
		else
			rm -rf "$E2E_TMP"
		fi
	fi
	log "cleanup done"
}

# e2e_check_clean: after cleanup, nothing of this run may be left.
e2e_check_clean() {
	local left=() i
	for ((i = 0; i < ${#_E2E_NETNS[@]}; i++)); do
		grep -qw -- "${_E2E_NETNS[i]}" <<<"$(ip netns list)" && left+=("netns ${_E2E_NETNS[i]}")
	done
	for i in "${E2E_DOCKERD_PIDS[@]}"; do kill -0 "$i" 2>/dev/null && left+=("dockerd pid $i"); done
	[[ -n $E2E_REGISTRY_PID ]] && kill -0 "$E2E_REGISTRY_PID" 2>/dev/null && left+=("registry pid $E2E_REGISTRY_PID")
	grep -qF "$E2E_TMP" <<<"$(findmnt -rn -o TARGET)" && left+=("mounts under $E2E_TMP")
	[[ -e $E2E_TMP ]] && [[ -z ${E2E_KEEP_TMP:-} ]] && left+=("$E2E_TMP")
	((${#left[@]} == 0)) || { printf 'left behind: %s\n' "${left[*]}" >&2; return 1; }
}

# e2e_setup: everything up to a ready swarm with the image on every node.
e2e_setup() {
	[[ $EUID -eq 0 ]] || die "run as root"
	e2e_install_packages
	e2e_make_tmp
	e2e_topology
	e2e_start_nodes
	e2e_swarm
	e2e_build_image
}
