// Command overlay-plugin is a Docker managed network plugin: a multi-host
// L2 overlay on kernel VXLAN. `overlay-plugin serve` is the plugin itself;
// the other subcommands talk to a running plugin through its admin socket.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/overlay-plugin/overlay-plugin/adminapi"
	"github.com/overlay-plugin/overlay-plugin/internal/admincli"
	"github.com/overlay-plugin/overlay-plugin/internal/envflag"
)

// version (the release, from the VERSION file) and commit are set at build
// time with -ldflags "-X main.version=... -X main.commit=...".
var version, commit = "dev", "unknown"

const usageText = `overlay-plugin: Docker network plugin for multi-host L2 overlays on VXLAN

usage: overlay-plugin <command> [flags]

commands:
  serve      run the plugin (Docker's network driver API and the admin API)
  state      print the plugin's networks, endpoints and peers as JSON
  peer add   add a remote endpoint to a network (only with --gossip-port 0)
  peer del   remove a remote endpoint from a network (only with --gossip-port 0)
  cluster    print the gossip members and statistics as JSON
  encryption print the IPsec key generations, hosts and SAs as JSON
  rotate-keys start a new IPsec key generation now
  reload     read the secret file now (it is also read every few seconds)
  check      print what is wrong on this host and with its peers (exit 1 if anything)
  version    print the version

Run 'overlay-plugin <command> -h' for a command's flags. Every flag can also
be set with the environment variable named in its help; a flag wins.
`

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run executes a command line and returns the exit status: 0, 1 on failure,
// 2 on a usage error.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return 2
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usageText)
		return 0
	case "serve":
		return runServe(rest, getenv, stdout, stderr)
	case "state":
		return reportErr(stderr, admincli.State(rest, getenv, stdout, stderr))
	case "peer":
		return reportErr(stderr, admincli.Peer(rest, getenv, stdout, stderr))
	case "cluster":
		return reportErr(stderr, admincli.Inspect("cluster", "Print the gossip members and statistics as JSON.", (*adminapi.Client).Cluster, rest, getenv, stdout, stderr))
	case "encryption":
		return reportErr(stderr, admincli.Inspect("encryption", "Print the IPsec key generations, hosts and SAs as JSON.", (*adminapi.Client).Encryption, rest, getenv, stdout, stderr))
	case "check":
		ok, err := admincli.Check(rest, getenv, stdout, stderr)
		switch {
		case err != nil:
			return reportErr(stderr, err)
		case !ok:
			return 1
		}
		return 0
	case "rotate-keys":
		return reportErr(stderr, admincli.Rotate(rest, getenv, stdout, stderr))
	case "reload":
		return reportErr(stderr, admincli.Reload(rest, getenv, stdout, stderr))
	case "version", "-version", "--version":
		if len(rest) > 0 {
			return reportErr(stderr, envflag.Usagef("version takes no arguments"))
		}
		fmt.Fprintf(stdout, "overlay-plugin %s (commit %s)\n", version, commit)
		return 0
	default:
		fmt.Fprintf(stderr, "overlay-plugin: unknown command %q\n\n%s", cmd, usageText)
		return 2
	}
}

// reportErr prints err and maps it to an exit status.
func reportErr(stderr io.Writer, err error) int {
	var ue envflag.UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "overlay-plugin: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "overlay-plugin: %v\n", err)
		return 1
	}
}
