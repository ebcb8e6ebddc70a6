package dockere2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Node is one Docker engine of the swarm and its host.
type Node struct {
	Index  int
	env    *Env
	docker []string // the docker CLI invocation, e.g. docker -H unix://...
	hostx  []string // runs a command on the node's host
}

// commandTimeout bounds one docker or host command (times the scale).
const commandTimeout = 60 * time.Second

func (n *Node) String() string { return "node" + strconv.Itoa(n.Index+1) }

// Docker runs the node's docker CLI and returns its stdout, trimmed; a
// failure's error holds stderr.
func (n *Node) Docker(args ...string) (string, error) {
	return n.DockerT(n.env.Scaled(commandTimeout), args...)
}

// DockerT is Docker under a time limit of its own (no scale applied).
func (n *Node) DockerT(limit time.Duration, args ...string) (string, error) {
	return run(limit, append(append([]string(nil), n.docker...), args...))
}

// Host runs a command on the node's host.
func (n *Node) Host(args ...string) (string, error) {
	if len(n.hostx) == 0 {
		return "", fmt.Errorf("%s: no host command prefix (%s)", n, envHostx)
	}
	return run(n.env.Scaled(commandTimeout), append(append([]string(nil), n.hostx...), args...))
}

// Exec runs a command in container cid on the node.
func (n *Node) Exec(cid string, args ...string) (string, error) {
	return n.Docker(append([]string{"exec", cid}, args...)...)
}

// Name is the node's host name, as its tasks' {{.Node.Hostname}}.
func (n *Node) Name() (string, error) { return n.Docker("info", "-f", "{{.Name}}") }

func run(limit time.Duration, argv []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	s := strings.TrimSpace(out.String())
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (timed out after %v)", err, limit)
		}
		return s, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()+" "+s))
	}
	return s, nil
}
