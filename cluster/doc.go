// Package cluster is the plugin's own control plane: the instances of the
// plugin on every host find each other with hashicorp/memberlist and
// replicate the table of endpoints (network, endpoint → IPs, MAC, VTEP),
// because Docker gives a network plugin no peer table.
//
// # Finding the others
//
// On a swarm nothing needs configuring: Docker's node discovery
// (DiscoverNew) names the other nodes when they join, and, since a plugin
// enabled on an existing swarm hears only of itself, the plugin also asks
// the engine through its API socket (every node knows its managers, a
// manager every node); both arrive here as NodeHint. Config.Join gives
// seeds elsewhere.
//
// # Scope
//
// Like Docker's NetworkDB, the table is scoped per network: a node keeps
// and receives the endpoint records of the networks it has (NetworkAdded,
// NetworkRemoved; Publish implies the network), nothing else. What every
// node keeps is who has which network: a membership record per (node,
// network), under the same rules as endpoint records. A node that leaves
// a network takes its records there with it.
//
// # Table and versions
//
// Every node owns the records of its local endpoints and is the only one to
// version them. A version is (Epoch, Seq): Epoch is the node's start time in
// ns (moved past any higher epoch found under its own name, so a clock that
// stepped back across a restart cannot make the new incarnation lose), Seq
// a per-node counter. Newer wins, equal is a no-op, older is dropped. A
// delete is a tombstone with a newer version, kept for TombstoneTTL; on the
// wire a tombstone carries its age, not a timestamp, so skew between
// clocks does not matter. A delete and a re-create of the same endpoint id
// therefore end in the re-created state everywhere, in whatever order or
// combination they arrive (moby #49908).
//
// # Ownership
//
// A record is accepted only from an owner that is a member, alive or gone
// for less than DeadGrace (a falsely suspected node keeps publishing);
// records of an owner gone past the grace are rejected, so a lagging node
// cannot resurrect what every node purged. Records whose owner is not yet
// known are held (bounded) until it joins, so gossip that outruns the
// owner's alive message is not lost. A record for an
// endpoint held under another owner is rejected unless that owner is gone
// past the grace period; a live record whose VTEP differs from the address
// its owner advertises in its memberlist meta is rejected. A record under
// this node's own name that this node does not hold is from an earlier
// incarnation: it is retracted with a newer tombstone; with
// Config.AwaitOwn only once the owner says OwnSettled, since a restarted
// node hears them back before its driver has republished what it still
// holds.
//
// # Dissemination
//
// An owner pushes its changed records straight to every alive member of
// their network, batched per member, over a TCP stream (push.go); a node new in a network (or back with a new incarnation) is
// pushed all of the owner's records there. Nothing is relayed, and record
// traffic never waits in memberlist's packet queue behind failure
// detection. Anti-entropy compares per-network digests with one random
// member per network every SyncInterval and, for the owners that differ,
// ships only what the other side likely lacks: records above its
// high-water mark of the owner, and none this node took in less than ten
// intervals ago, which the owner's push is still bringing (sync.go,
// shipment.go). So a record reaches each member about once: in a
// 100-host rollout the first version shipped each about 7 times more by
// anti-entropy than by push. A membership is pushed by its node to every
// alive node, broadcast by it through a memberlist.TransmitLimitedQueue
// (not relayed), counted in the digests and carried by memberlist's
// push/pull. Nodes that fail or leave keep their records for
// DeadGrace, then every node drops them locally. Every RejoinInterval the
// node re-joins seeds, Docker's node hints and former members that are not
// alive; every ProbeInterval it pings a few former members that are gone
// and joins those that answer, so a healed partition is noticed within
// about a second (rejoin.go). A member back from gone gets a push/pull
// and a digest exchange of the networks both have at once.
//
// # Connections
//
// memberlist dials a TCP connection per stream and closes it after one
// message. Two members of wire version 3 keep connections instead: what an
// outbox sends a member goes over a channel, one TCP connection per pair
// kept open and used both ways, a message after another (channel.go);
// memberlist's own streams (push/pull, fallback pings) share a yamux
// session (streampool.go, session.go). Each message is still memberlist's
// own, encrypted as memberlist would and checked by the screen. A 0.1.0
// member, a join and a channel or session refused get memberlist's
// connections. The transport is memberlist's, less the
// 64 KiB it allocated per datagram (transport.go).
//
// # Failure and partitions
//
// When memberlist declares a node dead, its records stay for DeadGrace (a
// node back within it loses nothing), then every node removes them; one
// that announced its restart (restart.go) keeps them for RestartGrace.
// After a partition, however long, each node rejoins the members it lost
// as soon as they answer its ping, then exchanges memberships and digests
// with each and pushes it its records: every table is exact again within
// about a second of the network coming back (TestPartitionPastGraceHeals
// requires 2 s in virtual time; test/gossip at most 5 s on three real
// hosts). Endpoints deleted meanwhile stay deleted.
//
// # Hostile input
//
// With a secret key all gossip is encrypted and authenticated (AES-GCM); a
// node without it can neither join nor inject records. Without one the
// cluster runs with unauthenticated gossip and warns at start. The screen
// (screen.go) decrypts and checks each datagram and each stream's message
// before memberlist sees it, and hands memberlist the plaintext, so each
// is decrypted once. Either way
// memberlist-compressed input is refused before memberlist sees it (a
// 31 KB datagram inflated to 40 MiB); this package never sends it. Every
// refusal is counted by reason (Stats, reject.go) and logged at a bounded
// rate (ratelog.go): the first of each reason, then at most one line per
// reason every 10 s saying how many were left out. Records follow the
// driver's id, address and MAC rules, so nothing can be added that cannot
// be deleted.
//
// # Wire versions
//
// Each node advertises the range of wire versions it speaks in its
// memberlist alive message (wire.go). A message to one node goes in the
// newest version both speak; a broadcast, which memberlist may hand to any
// node, goes in wireBroadcast, the previous release's newest; a node whose
// range does not meet this one's is refused. Version 3 adds the restart
// announcement and the settings each node tells the others (its VXLAN
// port and underlay MTU, settings.go), which a 0.1.0 node never gets.
//
// # Delivery
//
// Changes to remote records mark (network, endpoint) keys dirty; one
// goroutine takes the dirty set, copies the CURRENT values under the lock
// and calls the Sink with no lock held (AddPeer for a live remote record,
// DeletePeer otherwise). A stale value can therefore never overwrite a
// newer one, and bursts coalesce.
//
// # Locks
//
// Cluster.mu is the main lock of this package. It sits below the driver's
// network.mu (Publish, Retract, Snapshot, NetworkAdded and NetworkRemoved
// are called with one held) and below memberlist's internal node lock
// (memberlist calls its event delegate with that held). Above it nothing;
// below it only leaves: the broadcast queue's internal lock, and the log
// limiter's (ratelog.go), taken when the state logs a refusal. The
// connections' locks (a channel's writes, the channels, the pool of
// sessions, a session's streams) are never taken with mu held; their order
// is internal/lockrank's. With mu held
// the package never calls the Sink, never calls a memberlist.Memberlist
// method and never blocks on a channel; the push workers wait on a
// condition variable of mu, and send with it released.
package cluster
