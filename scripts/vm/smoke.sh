#!/usr/bin/env bash
# smoke.sh: runs INSIDE the test VM (scripts/vm/run.sh scripts/vm/smoke.sh).
# Proves the harness and that the guest kernel does IPsec ESP with AES-GCM:
# two namespaces joined by a veth pair (underlay 198.51.100.1/24 and .2/24), a VXLAN
# device in each (overlay 203.0.113.1/24 and .2/24, UDP 4789), ESP transport-mode SAs
# and policies for the VXLAN traffic, a ping across the overlay, and a check that
# every SA's byte counters grew. Then a negative check: with B's SAs gone, the
# same ping must fail (the policies do not let VXLAN through in clear).
# Directions use different key sizes: A->B AES-128-GCM (20-byte key+salt, 64-bit ICV,
# the plugin's design), B->A AES-256-GCM (36-byte key+salt, 128-bit ICV).
set -euo pipefail
A=vmsmoke-a B=vmsmoke-b
IP_A=198.51.100.1 IP_B=198.51.100.2
OV_A=203.0.113.1 OV_B=203.0.113.2
SPI_AB=0x0000a001 SPI_BA=0x0000b001 REQID=4242 VNI=4242

fail() {
	echo "SMOKE: FAIL: $*"
	exit 1
}
cleanup() {
	ip netns del "$A" 2>/dev/null || true
	ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2fs", b-a}'; }
hexkey() { head -c "$1" /dev/urandom | od -An -tx1 -v | tr -d ' \n'; }

ip xfrm state list >/dev/null 2>&1 || fail "this ip ($(command -v ip)) has no xfrm support"
t0=$(now)
cleanup
ip netns add "$A"
ip netns add "$B"
ip link add veth-a netns "$A" type veth peer name veth-b netns "$B"
ip -n "$A" addr add "$IP_A/24" dev veth-a
ip -n "$B" addr add "$IP_B/24" dev veth-b
for ns in "$A" "$B"; do
	ip -n "$ns" link set lo up
done
ip -n "$A" link set veth-a up
ip -n "$B" link set veth-b up

KEY_AB=0x$(hexkey 20) # AES-128 key + 4-byte salt
KEY_BA=0x$(hexkey 36) # AES-256 key + 4-byte salt
t1=$(now)
for ns in "$A" "$B"; do
	ip -n "$ns" xfrm state add src "$IP_A" dst "$IP_B" proto esp spi "$SPI_AB" reqid "$REQID" \
		mode transport aead 'rfc4106(gcm(aes))' "$KEY_AB" 64 ||
		fail "ip xfrm state add (rfc4106(gcm(aes)), 128-bit key) in $ns"
	ip -n "$ns" xfrm state add src "$IP_B" dst "$IP_A" proto esp spi "$SPI_BA" reqid "$REQID" \
		mode transport aead 'rfc4106(gcm(aes))' "$KEY_BA" 128 ||
		fail "ip xfrm state add (rfc4106(gcm(aes)), 256-bit key) in $ns"
done
echo "smoke: 4 ESP SAs added in $(since "$t1") (first use loads esp4/gcm and runs crypto self-tests)"
# Only the VXLAN traffic (UDP to 4789) is protected; inbound VXLAN must have come in ESP.
policy() { # ns local remote
	ip -n "$1" xfrm policy add src "$2/32" dst "$3/32" proto udp dport 4789 dir out \
		tmpl src "$2" dst "$3" proto esp reqid "$REQID" mode transport
	ip -n "$1" xfrm policy add src "$3/32" dst "$2/32" proto udp dport 4789 dir in \
		tmpl src "$3" dst "$2" proto esp reqid "$REQID" mode transport
}
policy "$A" "$IP_A" "$IP_B"
policy "$B" "$IP_B" "$IP_A"

vxlan() { # ns local remote dev overlay-address
	ip -n "$1" link add vx0 type vxlan id "$VNI" local "$2" remote "$3" dstport 4789 dev "$4"
	ip -n "$1" link set vx0 mtu 1400 up
	ip -n "$1" addr add "$5/24" dev vx0
}
vxlan "$A" "$IP_A" "$IP_B" veth-a "$OV_A"
vxlan "$B" "$IP_B" "$IP_A" veth-b "$OV_B"

t2=$(now)
ip netns exec "$A" ping -n -q -c 5 -i 0.2 -W 2 "$OV_B" ||
	fail "no ping reply across VXLAN over ESP"
ip netns exec "$A" ping -n -q -c 2 -i 0.2 -W 2 -s 1300 "$OV_B" >/dev/null ||
	fail "no reply to 1300-byte pings across VXLAN over ESP"
echo "smoke: pings across VXLAN+ESP answered in $(since "$t2")"

# SA byte counters: "  N(bytes), M(packets)" under "lifetime current:".
sa_bytes() { # ns spi
	ip -n "$1" -s xfrm state get src "$([[ $2 == "$SPI_AB" ]] && echo "$IP_A" || echo "$IP_B")" \
		dst "$([[ $2 == "$SPI_AB" ]] && echo "$IP_B" || echo "$IP_A")" proto esp spi "$2" |
		awk '/lifetime current:/ {c=1; next} c && /\(bytes\)/ {sub(/\(bytes\).*/, ""); print $1+0; exit}'
}
ok=1
for ns in "$A" "$B"; do
	for spi in "$SPI_AB" "$SPI_BA"; do
		bytes=$(sa_bytes "$ns" "$spi")
		echo "smoke: $ns SA spi $spi: ${bytes:-?} bytes"
		[[ ${bytes:-0} -gt 0 ]] || ok=0
	done
done
((ok)) || {
	ip -n "$A" -s xfrm state
	fail "an SA's byte counter did not grow"
}
echo "smoke: modules loaded: $(lsmod | awk '$1 ~ /^(esp4|gcm|ghash_generic|xfrm_user|vxlan|veth|aesni_intel)$/ {printf "%s ", $1}')"

# Negative check: without B's SAs the policies must drop the VXLAN traffic.
ip -n "$B" xfrm state flush
if ip netns exec "$A" ping -n -q -c 2 -i 0.2 -W 1 "$OV_B" >/dev/null 2>&1; then
	fail "ping still answered after B's SAs were flushed: VXLAN is not protected by the policies"
fi
# shellcheck disable=SC2016 # awk program
nostates=$(ip netns exec "$B" awk '$1 == "XfrmInNoStates" {print $2}' /proc/net/xfrm_stat)
echo "smoke: with B's SAs flushed the ping fails (B XfrmInNoStates=$nostates)"
[[ ${nostates:-0} -gt 0 ]] || fail "B dropped nothing for lack of a state"

echo "smoke: total $(since "$t0")"
echo "SMOKE: PASS"
