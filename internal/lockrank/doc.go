// Package lockrank is the plugin's lock order, in one place, and its check.
//
// Every mutex of the plugin's own code is a Mutex[C] whose class C names
// its rank. A goroutine may take a lock only if every lock it holds ranks
// above it: the order is total, so a cycle (a deadlock) cannot be written
// without a test built with the lockrank tag failing where the order is
// broken (make test runs the in-process suites that way). In other builds
// a Mutex is a sync.Mutex and costs nothing more.
//
// The lock graph, top to bottom (an arrow is "is taken while holding"):
//
//	rank  class         mutex                      guards                                        taken under
//	1     Network       driver network.mu          one network: endpoints, peer db, FDB counts,  -
//	                                               sandbox and its kernel state
//	2     Encryption    encryption Manager.mu      keys, peers' public keys, per-VTEP refcounts, Network
//	                                               every xfrm and firewall call
//	3     Publisher     encryption Publisher.mu    the latest public keys to gossip              Encryption
//	4     Cluster       cluster Cluster.mu         gossip records, members, outboxes             Network
//	5     RateLog       cluster logLimiter.mu      rejection log rate per reason                 Cluster
//	6     Driver        driver Driver.mu           the network table, VTEP, nodes, run context   Network, Encryption
//	7     LBSandboxes   driver lbNamespace.mu      one container's service VIP table             Network
//	8     Refusals      driver refusals.mu         networks this host refused                    Network
//	9     GroupCommit   driver groupCommit.mu      the state writes waiting for a transaction    Network
//	10    SandboxCache  kernel Netlink.mu          open sandbox namespaces and their sockets     Network
//	11    Pipeline      kernel pipeline.mu         one window of requests on a sandbox socket    Network
//	12    Echoes        kernel echoes.mu           the FDB events our own requests will cause    Pipeline
//	13    EventQueue    kernel eventQueue.mu       a watch's queued events                       -
//	14    XFRM          netlinkxfrm XFRM.mu        the xfrm netlink socket                       Encryption
//	15    Firewall      firewall Firewall.mu       the nftables batch and guarded VNIs           Encryption
//	16    ServiceWatch  enginewatch Services.mu    which networks' services are due              -
//	17    Gate          pluginapi Gate.mu          the shutdown flag and in-flight calls         -
//	18    Health        health Prober.mu           the data-path probes and paths' states        -
//	19    KeyRelay      controlplane keyRelay.mu   members' keys, secret ids until the manager   -
//	20    SourceFilter  vxlanfilter Filter.mu      the nftables batch, filtered VNIs, sources    Network
//	21    LBTables      servicelb known.mu         the VIP tables known unchanged since written  LBSandboxes
//	22    LBPaths       driver lbSandboxes.mu      the containers' entries and their users       Network
//	23    Channel       cluster channel.mu         writes on one member's channel                -
//	24    Channels      cluster Cluster.chMu       the open channels, by member                  Channel
//	25    StreamPool    cluster streamPool.mu      the sessions dialed and adopted, by address   -
//	26    SessionMu     cluster session.mu         one session's streams and their deadlines     Channel, Channels
//
// Locks of other modules sit below every lock here that calls into them
// (memberlist's node lock below Network, bbolt's below GroupCommit); the
// control plane never calls the driver (its Sink) holding Cluster.mu.
package lockrank
