// Package servicelb gives the plugin's networks service virtual IPs, what
// Docker swarm calls the "vip" endpoint mode: Docker allocates a VIP per
// service and its DNS resolves the service name to it, but it builds no
// load balancer for a plugin's network. This package does, by nftables NAT
// in each client container's own network namespace: a connection a
// container opens to a VIP is DNATed there to one of the service's tasks
// (backends), chosen at random per connection. The source stays the
// container's address (no masquerade); conntrack undoes the DNAT on the
// replies, and keeps every later packet of the connection on the same
// backend.
//
// # Rules
//
// One table of family inet, in each client sandbox:
//
//	table inet overlay_plugin_lb {
//		map vips4 { type ipv4_addr : verdict; elements = { VIP : goto svc-VIP, ... } }
//		map vips6 { type ipv6_addr : verdict; ... }
//		set empty4 { type ipv4_addr; elements = { VIP of a service without backends, ... } }
//		set empty6 { type ipv6_addr; ... }
//		map svc-VIP { type integer : verdict; elements = { 0 : goto be-VIP-B0, 1 : goto be-VIP-B1, ... } }
//		chain svc-VIP { numgen random mod N vmap @svc-VIP }
//		chain be-VIP-B0 { counter dnat ip to B0 }
//		...
//		chain dnat { type nat hook output priority dstnat; policy accept;
//			meta nfproto ipv4 ip daddr vmap @vips4
//			meta nfproto ipv6 ip6 daddr vmap @vips6 }
//		chain reject { type filter hook output priority filter; policy accept;
//			ct status dnat accept
//			meta nfproto ipv4 ip daddr @empty4 meta l4proto tcp reject with tcp reset
//			meta nfproto ipv4 ip daddr @empty4 reject with icmpx port-unreachable
//			(the same for ipv6 and @empty6) }
//	}
//
// (Names embed addresses, an IPv6 one with '_' for ':', so that nft can
// parse them; every rule carries a comment naming the service. nft shows
// the per-service maps' key as "type 0", google/nftables being unable to
// attach the typeof annotation.)
//
// A nat chain sees only the first packet of each connection, so it picks
// the backend once per connection: the VIP's map sends the packet to the
// service's chain, numgen draws a number below the number of backends, and
// the service's map sends it to that backend's chain, whose counter
// therefore counts connections, and whose dnat rewrites the destination
// address (any protocol: TCP, UDP, SCTP, ICMP echo; ports are left alone).
// Maps make the lookup cost independent of the number of services.
//
// One inet table rather than one per family: a single batch, a single
// table to remove, one place to read counters. Only the VIP maps and the
// empty sets are per family (a VIP's backends have its family). NAT in an
// inet table needs Linux 5.2.
//
// # Services without backends
//
// A connection to a VIP that has no backend must fail at once rather than
// hang until the client times out, so the reject chain refuses it: TCP
// with a reset, so connect(2) fails with ECONNREFUSED; anything else with
// an ICMP port unreachable, but since the reject verdict also drops the
// packet in the sender's own output path, a UDP send fails at once with
// EPERM. It is a filter chain, after dnat on the same hook, because reject
// is a filter verdict and must see every packet, not only a connection's
// first: it catches exactly the packets still addressed to a VIP, and
// never those of connections established before the service lost its
// backends (conntrack rewrote them to their backend before the chain).
//
// That last point holds only while conntrack runs in the namespace, and
// the kernel runs it only while some rule needs it: the dnat expressions
// do, but a table whose services have no backends has none. Conntrack
// would stop, established connections would lose their DNAT and meet the
// reject rules. The "ct status dnat" rule keeps it on (and lets balanced
// connections skip the lookups). Removing the table (Remove, or Apply with
// no services) can likewise end the NAT of connections made through VIPs,
// unless other NAT rules in the namespace keep it running: it is meant for
// a sandbox leaving the network, or whose services are all gone.
//
// # Changes
//
// Every change is one netlink batch, which the kernel applies atomically:
// a new connection meets either the old rules or the new ones. The first
// Apply to a sandbox writes the whole table (delete, then create). Later
// ones write only the difference when the Programmer knows the table is
// the one it last wrote: it notes the namespace's nf_tables generation
// after each of its batches (the kernel counts every commit there, by
// anyone), and finds it unchanged. The difference touches only the
// services that changed: their VIP's element, their pick map's elements,
// their service chain's rule, the chains of the backends added and
// removed; so its size depends on the change, not on the number of
// services, and the backends that stay keep their chains and counters.
// Anything else (no note, another generation, another namespace at the
// path, a renamed service, a difference the kernel refuses) takes Apply
// back to reading the kernel's table and replacing it whole, which is
// always right: the resync. So a table left by an earlier run, or changed
// from outside, is replaced by the first Apply that finds it.
//
// Conntrack keeps established
// connections on their backend whatever the rules become, so removing a
// backend breaks no connection to the others, and those to the removed one
// last as long as it answers: a draining task serves its connections to
// the end. UDP is the exception: a flow has no end the kernel could see,
// and one that keeps sending would stay on a removed backend forever, so
// Apply deletes the conntrack entries of UDP flows to the backends it
// removes; their next datagram is balanced anew. Counters carry over: a
// replace reads them first and creates the new counters with those
// values; connections opened in the instant between the read and the
// batch are not counted. A replace first compares the kernel's table with
// the one it would create and sends nothing when they are the same, and a
// difference of nothing is not sent, so repeating an Apply is cheap and
// leaves the counters exact.
//
// Every other table in the namespace is left alone; in particular the NAT
// Docker sets up there for its embedded DNS server (127.0.0.11) keeps
// working: both NAT chains run on the same hook, for other destinations.
//
// The driver uses a Programmer: NewNftables for the kernel, or the
// in-memory fake in servicelb/fakelb in tests.
package servicelb
