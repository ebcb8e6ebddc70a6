// Package admincli is overlay-plugin's admin commands (state, cluster,
// encryption, rotate-keys, peer, check): each parses its flags, asks the
// running plugin through its admin socket (adminapi) and prints the
// answer. cmd/overlay-plugin dispatches to them.
package admincli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/internal/envflag"
	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/peerdb"
)

// Where the admin socket is by default: the plugin's state directory.
const (
	DefaultStateDir = "/var/lib/overlay-plugin"
	SocketName      = "admin.sock"
)

// Flags registers --state-dir and --admin-socket, shared by serve and
// the admin commands.
func Flags(f *envflag.Set, stateDir, adminSocket *string) {
	f.StringEnv(stateDir, "state-dir", "OVERLAY_STATE_DIR", DefaultStateDir, "directory of the plugin's state (state.db, admin.sock)")
	f.StringEnv(adminSocket, "admin-socket", "OVERLAY_ADMIN_SOCKET", "", "admin API socket (default <state-dir>/"+SocketName+")")
}

// Socket is the admin socket: the one given, else the state directory's.
func Socket(stateDir, adminSocket string) string {
	if adminSocket != "" {
		return adminSocket
	}
	return filepath.Join(stateDir, SocketName)
}

// clientFlags registers the flags that locate the admin socket.
func clientFlags(f *envflag.Set) func() *adminapi.Client {
	var stateDir, adminSocket string
	Flags(f, &stateDir, &adminSocket)
	return func() *adminapi.Client { return adminapi.NewClient(Socket(stateDir, adminSocket)) }
}

// State prints the driver's state as indented JSON.
func State(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := envflag.New("state", "overlay-plugin state [flags]\n\nPrint the running plugin's networks, endpoints, peers, kernel entries, service VIPs (backends, connections) and the networks it refused, with why, as JSON.", stderr)
	client := clientFlags(f)
	if err := f.ParseEnv(args, getenv); err != nil {
		return err
	}
	c := client()
	defer c.Close()
	nets, err := c.Networks()
	if err != nil {
		return err
	}
	if nets == nil {
		nets = []driver.NetworkState{}
	}
	out, err := json.MarshalIndent(nets, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", out)
	return err
}

// Inspect prints one of the admin API's JSON views, indented.
func Inspect(name, what string, get func(*adminapi.Client) (json.RawMessage, error), args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := envflag.New(name, "overlay-plugin "+name+" [flags]\n\n"+what, stderr)
	client := clientFlags(f)
	if err := f.ParseEnv(args, getenv); err != nil {
		return err
	}
	c := client()
	defer c.Close()
	raw, err := get(c)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", buf.Bytes())
	return err
}

// Rotate asks the running plugin for a new key generation.
func Rotate(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return action("rotate-keys", "Start a new IPsec key generation now; senders switch to it after the lead time.",
		(*adminapi.Client).RotateKeys, "new key generation published; senders switch after the lead time", args, getenv, stdout, stderr)
}

// Reload asks the running plugin to read its secret file now.
func Reload(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return action("reload", "Read the secret file now (the plugin also reads it every few seconds): its\nsecrets are used at once, or, if the file cannot be used, the secrets held\nstay in use and the error says why.",
		(*adminapi.Client).ReloadSecrets, "secret file read; its secrets are in use (overlay-plugin cluster shows the ids)", args, getenv, stdout, stderr)
}

// action is a command that asks the plugin to do one thing and says so.
func action(name, what string, do func(*adminapi.Client) error, done string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := envflag.New(name, "overlay-plugin "+name+" [flags]\n\n"+what, stderr)
	client := clientFlags(f)
	if err := f.ParseEnv(args, getenv); err != nil {
		return err
	}
	c := client()
	defer c.Close()
	if err := do(c); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, done)
	return err
}

// Peer is `peer add` and `peer del`.
func Peer(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const synopsis = "peer add --network N --endpoint E --ip IP [--ip IP6] --mac MAC --vtep ADDR\n       overlay-plugin peer del --network N --endpoint E"
	if len(args) == 0 {
		fmt.Fprintf(stderr, "usage: overlay-plugin %s\n", synopsis)
		return envflag.Usagef("peer: missing subcommand add or del")
	}
	switch args[0] {
	case "add":
		return peerAdd(args[1:], getenv, stdout, stderr)
	case "del", "delete", "rm":
		return peerDel(args[1:], getenv, stdout, stderr)
	case "-h", "-help", "--help":
		fmt.Fprintf(stdout, "usage: overlay-plugin %s\n\nRun 'overlay-plugin peer add -h' for the flags.\n", synopsis)
		return nil
	}
	fmt.Fprintf(stderr, "usage: overlay-plugin %s\n", synopsis)
	return envflag.Usagef("peer: unknown subcommand %q (want add or del)", args[0])
}

func peerAdd(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := envflag.New("peer add", "overlay-plugin peer add --network N --endpoint E --ip IP [--ip IP6] --mac MAC --vtep ADDR\n\nAdd (or replace) a remote endpoint of a network: its addresses, MAC and host (VTEP).", stderr)
	client := clientFlags(f)
	var nid, eid, mac, vtep string
	var ips []netip.Addr
	f.StringVar(&nid, "network", "", "network id (required)")
	f.StringVar(&eid, "endpoint", "", "endpoint id (required)")
	f.Func("ip", "endpoint IP address, without prefix length (required; repeat for IPv4 and IPv6)", func(s string) error {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		ips = append(ips, a.Unmap())
		return nil
	})
	f.StringVar(&mac, "mac", "", "endpoint MAC address (required)")
	f.StringVar(&vtep, "vtep", "", "underlay address of the endpoint's host (required)")
	if err := f.ParseEnv(args, getenv); err != nil {
		return err
	}
	var missing []string
	for _, r := range []struct{ name, v string }{{"--network", nid}, {"--endpoint", eid}, {"--mac", mac}, {"--vtep", vtep}} {
		if r.v == "" {
			missing = append(missing, r.name)
		}
	}
	if len(ips) == 0 {
		missing = append(missing, "--ip")
	}
	if len(missing) > 0 {
		return envflag.Usagef("peer add: missing %s", strings.Join(missing, ", "))
	}
	p := peerdb.Peer{EndpointID: eid, IPs: ips}
	var err error
	if p.MAC, err = hwaddr.Parse(mac); err != nil {
		return envflag.Usagef("peer add: --mac: %v", err)
	}
	if p.VTEP, err = netip.ParseAddr(vtep); err != nil {
		return envflag.Usagef("peer add: --vtep: %v", err)
	}
	p.VTEP = p.VTEP.Unmap()
	c := client()
	defer c.Close()
	if err := c.AddPeer(nid, p); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "added peer %s to network %s\n", eid, nid)
	return nil
}

func peerDel(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := envflag.New("peer del", "overlay-plugin peer del --network N --endpoint E\n\nRemove a remote endpoint from a network (removing an absent one is not an error).", stderr)
	client := clientFlags(f)
	var nid, eid string
	f.StringVar(&nid, "network", "", "network id (required)")
	f.StringVar(&eid, "endpoint", "", "endpoint id (required)")
	if err := f.ParseEnv(args, getenv); err != nil {
		return err
	}
	var missing []string
	for _, r := range []struct{ name, v string }{{"--network", nid}, {"--endpoint", eid}} {
		if r.v == "" {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return envflag.Usagef("peer del: missing %s", strings.Join(missing, ", "))
	}
	c := client()
	defer c.Close()
	if err := c.DeletePeer(nid, eid); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed peer %s from network %s\n", eid, nid)
	return nil
}
