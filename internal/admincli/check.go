package admincli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/overlay-plugin/overlay-plugin/internal/envflag"
)

// Check prints the running plugin's check; ok says all is well.
func Check(args []string, getenv func(string) string, stdout, stderr io.Writer) (ok bool, err error) {
	f := envflag.New("check", "overlay-plugin check [flags]\n\nPrint everything wrong on this host and with its peers: data paths that do not carry VXLAN, ESP or the network's MTU (with the likely cause), settings the nodes disagree on, gossip refused and why, missing kernel features, networks refused, drift that keeps coming back. Exit status 0 when all is well, 1 otherwise.", stderr)
	client := clientFlags(f)
	asJSON := f.Bool("json", false, "print the report as JSON")
	if err := f.ParseEnv(args, getenv); err != nil {
		return false, err
	}
	c := client()
	defer c.Close()
	r, err := c.Check()
	if err != nil {
		return false, err
	}
	if *asJSON {
		out, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return false, err
		}
		fmt.Fprintf(stdout, "%s\n", out)
	} else {
		r.WriteText(stdout)
	}
	return r.OK, nil
}
