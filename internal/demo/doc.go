// Package demo is what `make demo` shows: the overlay plugin on three
// simulated hosts of this machine, built on internal/testbed, in a few
// seconds.
//
// Run, as root, touching nothing outside the namespaces it creates:
//
//  1. takes the plugin binary ($OVERLAY_PLUGIN_BIN, which `make demo`
//     sets to its `make build`; else go build ./cmd/overlay-plugin);
//  2. makes a "switch" namespace with a bridge and three "host"
//     namespaces h1, h2, h3 wired to it, underlay 198.51.100.1-3/24;
//  3. starts `overlay-plugin serve` in each host with its gossip control
//     plane on and a freshly generated cluster secret, h2 and h3 joining h1;
//  4. talks to each plugin's socket exactly as dockerd does:
//     GetCapabilities, AllocateNetwork on h1 (the swarm leader),
//     CreateNetwork everywhere, CreateEndpoint and Join on every host, then
//     moves the interface into a container namespace and sets its name,
//     MAC and addresses;
//  5. shows the gossip members, what each host learned by gossip (no peer
//     is fed by hand) and the kernel entries in each sandbox, then pings
//     every container from every other over IPv4 and IPv6;
//  6. with Keep, pauses and prints commands to look around;
//  7. cleans everything up, also on an error or a cancelled context
//     (Ctrl-C), killing processes by PID only.
//
// The command is internal/demo/cmd; the package's test runs the whole demo
// among the privileged tests, so it cannot rot unnoticed.
package demo
