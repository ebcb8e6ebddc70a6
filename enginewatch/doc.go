// Package enginewatch asks the local Docker engine, again and again, what
// a plugin is not told: the services of its networks (Services, for their
// VIPs) and the swarm's nodes (Nodes, as gossip hints). Both take the one
// engine client (dockerengine.Client), are built with New…, and run until
// the context given to Run ends. DataPathPort asks once, at start,
// the swarm's data-path port, which the plugin's VXLAN port follows.
package enginewatch
