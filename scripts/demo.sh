#!/usr/bin/env bash
# demo.sh — the overlay plugin on three simulated hosts, in under a minute.
#
# What it does (as root, on one Linux machine, touching nothing outside the
# network namespaces it creates):
#   1. builds the plugin (`make build`; set OVERLAY_PLUGIN_BIN to use a
#      binary you have instead);
#   2. makes a "switch" namespace with a bridge and three "host" namespaces
#      h1, h2, h3 wired to it, with underlay addresses 198.51.100.1-3/24;
#   3. starts `overlay-plugin serve` in each host with its gossip control
#      plane on, a freshly generated cluster secret, h2 and h3 joining h1;
#   4. talks to each plugin's socket exactly as dockerd does (curl
#      --unix-socket): GetCapabilities, AllocateNetwork on h1 (the swarm
#      leader), CreateNetwork everywhere, CreateEndpoint + Join on every
#      host, then moves the interface into a container namespace and sets
#      its name, MAC and addresses;
#   5. shows the gossip members, what each host learned by gossip (no peer
#      is fed by hand) and the kernel entries in each sandbox, then pings
#      every container from every other over IPv4 and IPv6;
#   6. cleans everything up (also on Ctrl-C or an error) and exits 0 only
#      if every ping answered.
#
# Usage: sudo scripts/demo.sh [--keep]
#   --keep   pause before cleaning up and print commands to look around.
#
# Needs: root, Go (for make build), and the Debian packages iproute2, curl
# and iputils-ping (installed with apt-get if missing).

set -euo pipefail

KEEP=0
for arg in "$@"; do
	case "$arg" in
	--keep) KEEP=1 ;;
	-h | --help)
		sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
		exit 0
		;;
	*)
		echo "demo.sh: unknown argument '$arg' (try --help)" >&2
		exit 2
		;;
	esac
done

if [[ -t 1 ]]; then
	B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' Y=$'\e[33m' C=$'\e[36m' N=$'\e[0m'
else
	B='' G='' R='' Y='' C='' N=''
fi
step() { printf '\n%s==> %s%s\n' "$B$C" "$*" "$N"; }
say() { printf '    %s\n' "$*"; }
die() {
	printf '%sdemo: %s%s\n' "$R" "$*" "$N" >&2
	exit 1
}

[[ $(id -u) -eq 0 ]] || die "run me as root (network namespaces need it): sudo $0"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
START=$SECONDS

# ---------------------------------------------------------------- packages
need_pkgs=()
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v bridge >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
command -v ping >/dev/null 2>&1 || need_pkgs+=(iputils-ping)
if ((${#need_pkgs[@]})); then
	step "Installing missing packages: ${need_pkgs[*]}"
	command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${need_pkgs[*]} yourself"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -o DPkg::Lock::Timeout=400 >/dev/null
	apt-get install -y -o DPkg::Lock::Timeout=400 --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
command -v nsenter >/dev/null 2>&1 || die "nsenter (util-linux) not found"

# ------------------------------------------------------------------- names
RUN="ovdemo$$"                  # unique per run: every namespace starts with it
SW="$RUN-sw"
HOSTS=(h1 h2 h3)
WORK=""
GOSSIP_PORT=7947
POOL4=203.0.113.0/24 GW4=203.0.113.254/24
POOL6=2001:db8:1::/64 GW6=2001:db8:1::fffe/64
CT=application/vnd.docker.plugins.v1.1+json

declare -A PID UNDERLAY EPID MAC ADDR4 ADDR6 CTR
NAMESPACES=() # in creation order
CLEANED=0

cleanup() {
	local rc=$?
	((CLEANED)) && return
	CLEANED=1
	trap "" INT TERM # finish cleaning up whatever arrives now
	trap - EXIT
	set +e
	step "Cleaning up"
	local h p
	for h in "${HOSTS[@]}"; do
		p=${PID[$h]:-}
		[[ -n $p ]] && kill -TERM "$p" 2>/dev/null
	done
	for h in "${HOSTS[@]}"; do
		p=${PID[$h]:-}
		[[ -z $p ]] && continue
		for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$p" 2>/dev/null; then
			say "plugin on $h (pid $p) ignored SIGTERM for 10 s: killing it"
			kill -KILL "$p" 2>/dev/null
		fi
		wait "$p" 2>/dev/null
		say "stopped the plugin on $h (pid $p)"
	done
	local i ns left
	for ((i = ${#NAMESPACES[@]} - 1; i >= 0; i--)); do
		ns=${NAMESPACES[$i]}
		[[ -e /run/netns/$ns ]] || continue
		left=$(ip netns pids "$ns" 2>/dev/null)
		if [[ -n $left ]]; then
			say "processes left in $ns: $left (killing them by pid)"
			kill -KILL $left 2>/dev/null
		fi
		ip netns delete "$ns" || say "${R}could not delete namespace $ns$N"
	done
	say "deleted ${#NAMESPACES[@]} namespaces"
	[[ -n ${WORK:-} && -d $WORK ]] && rm -rf "$WORK" && say "removed $WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

newns() {
	ip netns add "$1"
	NAMESPACES+=("$1")
	ip -n "$1" link set lo up
}

# plugin HOST PATH JSON: POST to the plugin's Docker socket like dockerd,
# print the response; fail on an HTTP error or a non-empty "Err".
plugin() {
	local h=$1 path=$2 body=${3:-'{}'} out
	out=$(curl -sS --fail-with-body --max-time 30 --unix-socket "$WORK/$h/plugin.sock" \
		-H "Content-Type: $CT" -H "Accept: $CT" -X POST --data "$body" "http://plugin$path") ||
		die "$h $path failed: $out"
	if [[ $out =~ \"Err\":\"([^\"]+)\" ]]; then
		die "$h $path: ${BASH_REMATCH[1]}"
	fi
	printf '%s' "$out"
}

# admin HOST PATH: GET from the plugin's admin API.
admin() {
	curl -sS --fail-with-body --max-time 10 --unix-socket "$WORK/$1/admin.sock" "http://admin$2"
}

# json_str KEY JSON: the first string value of KEY.
json_str() {
	[[ $2 =~ \"$1\":\"([^\"]*)\" ]] && printf '%s' "${BASH_REMATCH[1]}"
}

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

WORK=$(mktemp -d /tmp/ovdemo.XXXXXX) # short: unix socket paths are limited
NET_ID=$(hex 13 | cut -c1-25)        # 25 characters, like swarm's base-36 ids

# ------------------------------------------------------------------- build
if [[ -n ${OVERLAY_PLUGIN_BIN:-} ]]; then
	BIN=$(readlink -f "$OVERLAY_PLUGIN_BIN")
	step "Using the plugin binary $BIN (OVERLAY_PLUGIN_BIN)"
else
	step "Building the plugin (make build)"
	command -v go >/dev/null 2>&1 || die "Go is needed to build the plugin (or set OVERLAY_PLUGIN_BIN)"
	make -C "$REPO" --no-print-directory build | sed 's/^/    /'
	BIN=$REPO/bin/overlay-plugin
fi
[[ -x $BIN ]] || die "no plugin binary at $BIN"

# A run killed outright (SIGKILL) could not clean up: remove what runs whose
# shell is gone left, killing their processes by pid.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ovdemo[0-9]+-' || true); do
	owner=${ns#ovdemo}
	owner=${owner%%-*}
	[[ -d /proc/$owner ]] && continue
	left=$(ip netns pids "$ns" 2>/dev/null || true)
	[[ -n $left ]] && kill -KILL $left 2>/dev/null
	ip netns delete "$ns" 2>/dev/null && say "removed $ns, left by an earlier run that was killed"
done

# ---------------------------------------------------------------- topology
step "Creating a switch and three hosts (namespaces $RUN-*)"
newns "$SW"
ip -n "$SW" link add br0 type bridge stp_state 0 forward_delay 0
ip -n "$SW" link set br0 up
i=0
for h in "${HOSTS[@]}"; do
	i=$((i + 1))
	ns="$RUN-$h"
	newns "$ns"
	UNDERLAY[$h]=198.51.100.$i
	# The pair is made inside the switch and its far end sent straight to
	# the host: nothing ever appears in this machine's own namespace.
	ip -n "$SW" link add "p$i" type veth peer name eth0 netns "$ns"
	ip -n "$SW" link set "p$i" master br0 up
	ip -n "$ns" addr add "${UNDERLAY[$h]}/24" dev eth0
	ip -n "$ns" link set eth0 up
	say "$h: namespace $ns, underlay ${UNDERLAY[$h]}/24 on the switch"
done
for h in h2 h3; do
	ok=0
	for _ in $(seq 30); do
		if ip netns exec "$RUN-$h" ping -c1 -W1 -q "${UNDERLAY[h1]}" >/dev/null 2>&1; then ok=1; break; fi
	done
	((ok)) || die "underlay: $h cannot reach h1"
done

# ----------------------------------------------------------------- plugins
step "Starting overlay-plugin serve on every host (gossip on, shared secret)"
mkdir -p "$WORK"
head -c 32 /dev/urandom | base64 >"$WORK/secret"
chmod 600 "$WORK/secret"
say "cluster secret: $WORK/secret (base64, 32 random bytes)"
for h in "${HOSTS[@]}"; do
	d=$WORK/$h
	mkdir -p "$d"
	args=(serve --socket "$d/plugin.sock" --admin-socket "$d/admin.sock" --state-dir "$d/state"
		--sandbox-dir "$d/sandbox" --advertise-addr "${UNDERLAY[$h]}" --node-name "$h"
		--gossip-port "$GOSSIP_PORT" --secret-file "$WORK/secret" --log-level info)
	[[ $h != h1 ]] && args+=(--join "${UNDERLAY[h1]}")
	# `ip netns exec` execs the plugin in place: $! is the plugin's pid.
	ip netns exec "$RUN-$h" "$BIN" "${args[@]}" >"$d/plugin.log" 2>&1 &
	PID[$h]=$!
	if [[ $h == h1 ]]; then how="the seed"; else how="--join ${UNDERLAY[h1]}"; fi
	say "$h: pid ${PID[$h]}, $how, gossip on ${UNDERLAY[$h]}:$GOSSIP_PORT, log $d/plugin.log"
done
for h in "${HOSTS[@]}"; do
	ok=0
	for _ in $(seq 100); do
		kill -0 "${PID[$h]}" 2>/dev/null || { tail -n 20 "$WORK/$h/plugin.log" >&2; die "the plugin on $h exited"; }
		if [[ -S $WORK/$h/plugin.sock ]] && admin "$h" /healthz >/dev/null 2>&1; then ok=1; break; fi
		sleep 0.1
	done
	((ok)) || die "the plugin on $h did not become ready"
done
say "all three plugins answer /healthz"

# ------------------------------------------------- what dockerd would send
step "Talking to the plugins like dockerd (curl --unix-socket)"
for h in "${HOSTS[@]}"; do
	caps=$(plugin "$h" /NetworkDriver.GetCapabilities)
	plugin "$h" /NetworkDriver.DiscoverNew \
		"{\"DiscoveryType\":1,\"DiscoveryData\":{\"Address\":\"${UNDERLAY[$h]}\",\"BindAddress\":\"${UNDERLAY[$h]}\",\"Self\":true}}" >/dev/null
done
say "GetCapabilities -> $caps"
ipam4="[{\"AddressSpace\":\"GlobalDefault\",\"Pool\":\"$POOL4\",\"Gateway\":\"$GW4\"}]"
ipam6="[{\"AddressSpace\":\"GlobalDefault\",\"Pool\":\"$POOL6\",\"Gateway\":\"$GW6\"}]"
alloc=$(plugin h1 /NetworkDriver.AllocateNetwork "{\"NetworkID\":\"$NET_ID\",\"Options\":{},\"IPv4Data\":$ipam4}")
[[ $alloc =~ \"Options\":(\{[^{}]*\}) ]] || die "AllocateNetwork answered $alloc"
generic=${BASH_REMATCH[1]}
say "AllocateNetwork on h1 (the swarm leader) -> options $generic"
for h in "${HOSTS[@]}"; do
	plugin "$h" /NetworkDriver.CreateNetwork "{\"NetworkID\":\"$NET_ID\",\"Options\":{\"com.docker.network.generic\":$generic,\"com.docker.network.enable_ipv6\":true},\"IPv4Data\":$ipam4,\"IPv6Data\":$ipam6}" >/dev/null
done
say "CreateNetwork $NET_ID on h1, h2, h3 ($POOL4, $POOL6)"

i=0
for h in "${HOSTS[@]}"; do
	i=$((i + 1))
	c="$RUN-c$i"
	CTR[$h]=$c
	newns "$c"
	EPID[$h]=$(hex 32)
	ADDR4[$h]=203.0.113.$((10 + i))
	ADDR6[$h]=2001:db8:1::$((10 + i))
	resp=$(plugin "$h" /NetworkDriver.CreateEndpoint "{\"NetworkID\":\"$NET_ID\",\"EndpointID\":\"${EPID[$h]}\",\"Interface\":{\"Address\":\"${ADDR4[$h]}/24\",\"AddressIPv6\":\"${ADDR6[$h]}/64\"},\"Options\":{}}")
	MAC[$h]=$(json_str MacAddress "$resp") || die "CreateEndpoint on $h gave no MAC: $resp"
	resp=$(plugin "$h" /NetworkDriver.Join "{\"NetworkID\":\"$NET_ID\",\"EndpointID\":\"${EPID[$h]}\",\"SandboxKey\":\"/run/netns/$c\",\"Options\":{}}")
	src=$(json_str SrcName "$resp") || die "Join on $h named no interface: $resp"
	prefix=$(json_str DstPrefix "$resp") || prefix=eth
	gw=$(json_str Gateway "$resp") || gw=
	# What dockerd does next: move the interface into the container, name
	# it, give it its MAC and addresses, bring it up.
	ip -n "$RUN-$h" link set "$src" netns "$c"
	ip -n "$c" link set "$src" name "${prefix}0"
	ip -n "$c" link set "${prefix}0" address "${MAC[$h]}"
	ip -n "$c" addr add "${ADDR4[$h]}/24" dev "${prefix}0"
	ip -n "$c" addr add "${ADDR6[$h]}/64" dev "${prefix}0" nodad
	ip -n "$c" link set "${prefix}0" up
	[[ -n $gw ]] && ip -n "$c" route add default via "$gw" dev "${prefix}0"
	say "container c$i on $h: ${ADDR4[$h]}, ${ADDR6[$h]}, MAC ${MAC[$h]} (endpoint ${EPID[$h]:0:12}, veth $src)"
done

# --------------------------------------------------------------- the show
remote_peers() { # HOST: number of remote peers the host holds
	local json
	json=$(admin "$1" /v1/networks) || return 1
	grep -o '{"endpointID":[^{}]*}' <<<"$json" | grep -vc '"local":true' || true
}

step "Waiting for gossip to spread the endpoints (no peer is fed by hand)"
t0=$SECONDS
for _ in $(seq 100); do
	done_hosts=0
	for h in "${HOSTS[@]}"; do
		[[ $(remote_peers "$h") == 2 ]] && done_hosts=$((done_hosts + 1))
	done
	((done_hosts == 3)) && break
	sleep 0.2
done
if ((done_hosts == 3)); then
	say "every host knows the other two endpoints (after $((SECONDS - t0)) s)"
else
	say "${Y}only $done_hosts of 3 hosts know both remote endpoints after 20 s; carrying on$N"
fi

step "Gossip members, as each plugin sees them (GET /v1/cluster, or: overlay-plugin cluster)"
for h in "${HOSTS[@]}"; do
	json=$(admin "$h" /v1/cluster) || { say "$h: /v1/cluster failed"; continue; }
	line=""
	while read -r m; do
		[[ -z $m ]] && continue
		name=$(json_str name "$m") state=$(json_str state "$m") vtep=$(json_str vtep "$m")
		[[ $m == *'"self":true'* ]] && name="$name(self)"
		line+="$name=$state@$vtep  "
	done < <(grep -o '{[^{}]*"name":[^{}]*}' <<<"$json")
	say "$h sees: $line"
done

step "What each host learned by gossip, and the kernel entries in its sandbox"
for h in "${HOSTS[@]}"; do
	json=$(admin "$h" /v1/networks)
	say "${B}$h${N} remote peers (GET /v1/networks):"
	while read -r p; do
		[[ -z $p || $p == *'"local":true'* ]] && continue
		ips=$(grep -o '"ips":\[[^]]*\]' <<<"$p" | sed 's/"ips":\[//; s/\]//; s/"//g')
		say "    endpoint $(json_str endpointID "$p" | head -c 12)  ips $ips  mac $(json_str mac "$p")  on VTEP $(json_str vtep "$p")"
	done < <(grep -o '{"endpointID":[^{}]*}' <<<"$json")
	sandbox=$(json_str sandbox "$json") || sandbox=
	if [[ -n $sandbox ]]; then
		sbpath=/proc/${PID[$h]}/root$WORK/$h/sandbox/$sandbox
		say "  kernel, read inside the sandbox (nsenter --net=$sbpath):"
		nsenter --net="$sbpath" ip neigh show dev vxlan0 nud permanent | sed 's/^/        neigh /'
		nsenter --net="$sbpath" bridge fdb show dev vxlan0 | grep -v master | sed 's/^/        fdb   /'
	fi
done

step "Pinging every container from every other, across hosts (IPv4 and IPv6)"
pass=0 fail=0 failed=()
for a in "${HOSTS[@]}"; do
	for b in "${HOSTS[@]}"; do
		[[ $a == "$b" ]] && continue
		for fam in 4 6; do
			if [[ $fam == 4 ]]; then dst=${ADDR4[$b]}; else dst=${ADDR6[$b]}; fi
			ok=0
			# The first packets may wait for the containers' neighbour
			# resolution (answered locally by the VXLAN proxy).
			for _ in 1 2 3 4 5; do
				if ip netns exec "${CTR[$a]}" ping -"$fam" -c1 -W1 -q "$dst" >/dev/null 2>&1; then ok=1; break; fi
			done
			if ((ok)) && ip netns exec "${CTR[$a]}" ping -"$fam" -c3 -i0.2 -W1 -q "$dst" >/dev/null 2>&1; then
				pass=$((pass + 1))
				say "${G}ok${N}    c${a#h} ($a) -> c${b#h} ($b)  $dst"
			else
				fail=$((fail + 1))
				failed+=("c${a#h}->c${b#h} $dst")
				say "${R}FAIL${N}  c${a#h} ($a) -> c${b#h} ($b)  $dst"
			fi
		done
	done
done

step "Summary"
say "3 hosts, gossip members and endpoints spread without any manual peer"
say "pings: $pass passed, $fail failed (of $((pass + fail)))"
((fail == 0)) || say "${R}failed: ${failed[*]}$N"
say "took $((SECONDS - START)) s"

if ((KEEP)); then
	step "Leaving everything up (--keep). Try, in another shell:"
	say "ip netns exec ${CTR[h1]} ping ${ADDR4[h2]}"
	say "ip netns exec ${CTR[h3]} ping ${ADDR6[h1]}"
	say "$BIN cluster --admin-socket $WORK/h1/admin.sock"
	say "$BIN state --admin-socket $WORK/h2/admin.sock"
	say "curl -s --unix-socket $WORK/h3/admin.sock http://admin/v1/cluster"
	sb=$(json_str sandbox "$(admin h1 /v1/networks)") || sb=
	[[ -n $sb ]] && say "nsenter --net=/proc/${PID[h1]}/root$WORK/h1/sandbox/$sb bridge fdb show dev vxlan0"
	say "tail -f $WORK/h2/plugin.log"
	say "kill -KILL ${PID[h3]}   # crash h3: after the dead grace (30 s) h1 and h2 drop its endpoint"
	printf '\n    %sPress Enter to clean up.%s ' "$B" "$N"
	read -r _ || true
fi

if ((fail == 0)); then
	printf '\n%sdemo: all %d pings passed%s\n' "$G$B" "$pass" "$N"
	exit 0
fi
printf '\n%sdemo: %d of %d pings failed%s\n' "$R$B" "$fail" "$((pass + fail))" "$N"
exit 1
