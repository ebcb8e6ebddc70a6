package dockere2e

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Endpoint is one web container (a task or a docker run) on a network,
// serving Host over HTTP on Port.
type Endpoint struct {
	Node          *Node
	CID, IP, Host string
}

// TaskEndpoints are one running task of svc per node, on network net.
func (c *Check) TaskEndpoints(svc, net string) ([]Endpoint, error) {
	eps := make([]Endpoint, len(c.Nodes))
	for i, n := range c.Nodes {
		tasks := c.RunningTasks(n, svc)
		if len(tasks) == 0 {
			return nil, fmt.Errorf("no running task of %s on %s", svc, n)
		}
		ep := Endpoint{Node: n, CID: tasks[0]}
		var err error
		if ep.IP, err = c.IP(n, ep.CID, net); err != nil || ep.IP == "" {
			return nil, fmt.Errorf("task %.12s on %s has no address on %s (%v)", ep.CID, n, net, err)
		}
		if ep.Host, err = n.Name(); err != nil {
			return nil, err
		}
		eps[i] = ep
	}
	return eps, nil
}

// WebContainers runs a web container name-<i> on every node i, on net.
func (c *Check) WebContainers(net, name string) ([]Endpoint, error) {
	eps := make([]Endpoint, len(c.Nodes))
	for i, n := range c.Nodes {
		host, err := n.Name()
		if err != nil {
			return nil, err
		}
		args := append([]string{"--hostname", host, "--network", net, c.Image}, webCmd...)
		cid, err := c.RunContainer(n, fmt.Sprintf("%s-%d", name, i), args...)
		if err != nil {
			return nil, fmt.Errorf("docker run --network %s on %s: %w", net, host, err)
		}
		ip, err := c.IP(n, cid, net)
		if err != nil {
			return nil, err
		}
		eps[i] = Endpoint{Node: n, CID: cid, IP: ip, Host: host}
		c.T.Logf("container %s-%d on %s: %s", name, i, host, ip)
	}
	return eps, nil
}

// Get fetches http://addr:port/ from ep's container, once.
func (ep Endpoint) Get(addr string, port int) (string, error) {
	return ep.Node.Exec(ep.CID, "timeout", "5", "wget", "-q", "-O-", fmt.Sprintf("http://%s:%d/", addr, port))
}

var reAddress = regexp.MustCompile(`^Address:?\s*(\S+?)(:53)?$`)

// Resolve is what Docker's embedded DNS answers ep's container for name,
// every address (busybox nslookup asked at 127.0.0.11 lists them all).
func (ep Endpoint) Resolve(name string) []string {
	out, _ := ep.Node.Exec(ep.CID, "nslookup", name, "127.0.0.11")
	return nslookupAnswers(out)
}

// nslookupAnswers are the distinct addresses of busybox nslookup's
// answer, sorted (the server's own address comes before "Name:").
func nslookupAnswers(out string) []string {
	var addrs []string
	answer := false
	for l := range strings.SplitSeq(out, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "Name:") {
			answer = true
			continue
		}
		if m := reAddress.FindStringSubmatch(l); answer && m != nil && !slices.Contains(addrs, m[1]) {
			addrs = append(addrs, m[1])
		}
	}
	slices.Sort(addrs)
	return addrs
}

// Matrix tries every ordered pair of endpoints and keeps every outcome,
// as Felix's connectivity checker does: one failed pair does not hide the
// others.
type Matrix struct {
	c      *Check
	failed []string
}

func (m *Matrix) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.c.T.Log("FAIL: " + msg)
	m.failed = append(m.failed, msg)
}

// Err is every failure so far, or nil.
func (m *Matrix) Err() error {
	if len(m.failed) == 0 {
		return nil
	}
	return errors.New(strings.Join(m.failed, "; "))
}

// ByAddress: each endpoint reaches every other by address and gets its
// host name back, retried for 20 s (5 s once a pair failed).
func (m *Matrix) ByAddress(eps []Endpoint, port int) {
	retry := 20 * time.Second
	for i, from := range eps {
		for j, to := range eps {
			if i == j {
				continue
			}
			var body string
			err := m.c.Retry(retry, func() error {
				var err error
				body, err = from.Get(to.IP, port)
				if err == nil && body != to.Host && to.Host != "" {
					err = fmt.Errorf("answered %.200q", body)
				}
				return err
			})
			if err != nil {
				m.fail("%s -> %s by address %s: %v", from.Host, to.Host, to.IP, err)
				retry = 5 * time.Second
				continue
			}
			m.c.T.Logf("%s -> %s by address %s: ok", from.Host, to.Host, to.IP)
		}
	}
}

// ByName: each endpoint's embedded DNS resolves name to at least the
// addresses of want, or exactly to them (within 15 s).
func (m *Matrix) ByName(eps []Endpoint, name string, want []Endpoint, exactly bool) {
	for _, from := range eps {
		var got []string
		err := m.c.Retry(15*time.Second, func() error {
			got = from.Resolve(name)
			for _, w := range want {
				if !slices.Contains(got, w.IP) {
					return fmt.Errorf("without %s", w.IP)
				}
			}
			if exactly && len(got) != len(want) {
				return fmt.Errorf("want only %d address(es)", len(want))
			}
			return nil
		})
		if err != nil {
			m.fail("%s: %s resolves to %v, %v", from.Host, name, got, err)
			continue
		}
		m.c.T.Logf("%s: %s -> %v", from.Host, name, got)
	}
}

// Mesh is ck_mesh: one task of svc per node reaches every other node's
// task on net by address and, with dns, through tasks.<svc> (not for a
// task on several networks: the embedded DNS answers with the first
// network's addresses only).
func (c *Check) Mesh(svc, net string, dns bool) error {
	eps, err := c.TaskEndpoints(svc, net)
	if err != nil {
		return err
	}
	m := &Matrix{c: c}
	m.ByAddress(eps, Port)
	if dns {
		m.ByName(eps, "tasks."+svc, eps, false)
		c.noteWget(eps, "tasks."+svc)
	}
	return m.Err()
}

// noteWget notes what busybox wget makes of the name itself: FIELD-NOTES
// saw it segfault on name lookups, so this only informs.
func (c *Check) noteWget(eps []Endpoint, name string) {
	for _, ep := range eps {
		body, err := ep.Get(name, Port)
		c.T.Logf("note: %s: wget http://%s:%d/ -> %.100q (%v)", ep.Host, name, Port, body, err)
	}
}
