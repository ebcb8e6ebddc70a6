package multihost

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"
	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// survivingPlugin keeps its sandboxes across its own restarts, as a
// managed plugin's on the host's /run/overlay-plugin do.
var survivingPlugin = testbed.PluginConfig{SandboxesOutlive: true}

// TestDamagedStateKeepsContainers: a plugin whose state.db is damaged (0
// bytes, truncated, garbled pages or meta page) or of a newer schema
// refuses to start, says why, and leaves the file as it was; the running
// sandbox and the container's interface stay, and the container keeps
// reaching its peer throughout. A state with an unreadable record, and
// one moved aside, start: the running sandbox is adopted, not removed,
// and the lost network's VNI is not handed out again.
func TestDamagedStateKeepsContainers(t *testing.T) {
	requireTestbed(t)
	c := setupWith(t, testbed.IPv4, 2, survivingPlugin)
	n1, n2 := c.nodes[0], c.nodes[1]
	dst, _ := n2.ep.Ctr.Addr(testbed.IPv4)
	if err := n1.ep.Ctr.PingUntil(dst, firstPing); err != nil {
		t.Fatal(err)
	}
	if err := n1.Plugin.Stop(0); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(n1.Plugin.StateDir, "state.db")
	good, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	const page = 4096
	for _, tc := range []struct {
		name, want string
		data       func() []byte
	}{
		{"empty", "unreadable", func() []byte { return nil }},
		{"truncated", "truncated", func() []byte { return good[:len(good)/2] }},
		{"truncated to a page", "truncated", func() []byte { return good[:page] }},
		{"garbled pages", "unreadable", func() []byte { return garbleFrom(good, 2*page) }},
		{"garbled meta page", "unreadable", func() []byte { return garble(good, 0, page) }},
		{"newer version", "newer overlay-plugin", func() []byte { return withVersion(t, good, "2") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := tc.data()
			if err := os.WriteFile(dbPath, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			p, err := n1.StartPlugin(n1.Config)
			if err == nil {
				t.Fatalf("plugin started on a damaged state.db (pid %d)", p.Pid())
			}
			if werr := p.Wait(testbed.PluginStopTimeout); werr == nil {
				t.Fatal("plugin exited 0 on a damaged state.db")
			}
			if log := p.LogTail(40); !strings.Contains(log, tc.want) || !strings.Contains(log, "mv "+dbPath) {
				t.Fatalf("the log does not say %q and what to do:\n%s", tc.want, log)
			}
			if got, err := os.ReadFile(dbPath); err != nil || !bytes.Equal(got, bad) {
				t.Fatalf("state.db changed (%d bytes, was %d): %v", len(got), len(bad), err)
			}
			checkContainerKept(t, n1, dst)
		})
	}

	// A network record this build cannot read: the plugin starts, adopts
	// the sandbox with its joined endpoint, and leaves the record alone.
	record := []byte(`{"id":"` + c.nw.ID + `","vni":` + strconv.Itoa(int(c.nw.VNI)) + `,"subnets":[],"future":1}`)
	if err := os.WriteFile(dbPath, withRecord(t, good, c.nw.ID, record), 0o600); err != nil {
		t.Fatal(err)
	}
	n1.Plugin = startAdopting(t, n1, c, dst)
	if st, err := n1.Plugin.Network(c.nw.ID); err != nil || len(st.Endpoints) != 1 || !st.Endpoints[0].Joined {
		t.Fatalf("endpoint of the unreadable network: %+v %v", st, err)
	}
	if err := n1.Plugin.Stop(0); err != nil {
		t.Fatal(err)
	}
	if got := readRecord(t, dbPath, c.nw.ID); !bytes.Equal(got, record) {
		t.Fatalf("the unreadable record was rewritten: %s", got)
	}

	// The state moved aside: a fresh start adopts the running sandbox.
	if err := os.Rename(dbPath, dbPath+".bad"); err != nil {
		t.Fatal(err)
	}
	n1.Plugin = startAdopting(t, n1, c, dst)
	// h1 is the leader: the lost network's VNI is not handed out again.
	other := testbed.SwarmID()
	alloc, err := n1.Plugin.API.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: other, Options: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	if alloc.Options["vxlanid_list"] == strconv.Itoa(int(c.nw.VNI)) {
		t.Fatalf("VNI %d of the running network handed out again", c.nw.VNI)
	}
	if err := n1.Plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: other}); err != nil {
		t.Fatal(err)
	}
	// Gossip would tell the restarted plugin its peer again.
	if err := n1.Plugin.Admin.AddPeer(c.nw.ID, n2.ep.Peer()); err != nil {
		t.Fatalf("AddPeer to the adopted network: %v", err)
	}
	if err := n1.ep.Ctr.PingUntil(dst, firstPing); err != nil {
		t.Fatal(err)
	}
	// Docker's calls for the old container succeed and clean up.
	c.teardown(t)
}

// startAdopting starts n's plugin, which must adopt the running sandbox of
// c's network: the container's interface stays and its traffic flows.
func startAdopting(t *testing.T, n *node, c *cluster, dst netip.Addr) *testbed.Plugin {
	t.Helper()
	p, err := n.StartPlugin(n.Config)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Network(c.nw.ID)
	if err != nil || st.Sandbox != c.nw.ID || st.VNI != c.nw.VNI {
		t.Fatalf("running sandbox not adopted: %+v %v\n%s", st, err, p.LogTail(40))
	}
	checkContainerKept(t, n, dst)
	return p
}

// checkContainerKept checks that n's container still has its interface and
// reaches dst.
func checkContainerKept(t *testing.T, n *node, dst netip.Addr) {
	t.Helper()
	links, err := n.ep.Ctr.Links()
	if err != nil || len(links) != 2 {
		t.Fatalf("container interfaces: %v %v, want lo and its overlay interface", links, err)
	}
	if files, err := n.Plugin.SandboxFiles(); err != nil || len(files) != 1 {
		t.Fatalf("sandbox mounts: %v %v", files, err)
	}
	if err := n.ep.Ctr.PingUntil(dst, 5*time.Second); err != nil {
		t.Fatalf("traffic stopped: %v", err)
	}
}

func garble(b []byte, from, n int) []byte {
	out := bytes.Clone(b)
	for i := from; i < from+n && i < len(out); i++ {
		out[i] = byte(i*7 + 3)
	}
	return out
}

func garbleFrom(b []byte, from int) []byte { return garble(b, from, len(b)) }

// edited returns the database b after f ran on it in an update.
func edited(t *testing.T, b []byte, f func(tx *bbolt.Tx) error) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(f)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func withVersion(t *testing.T, b []byte, v string) []byte {
	return edited(t, b, func(tx *bbolt.Tx) error { return tx.Bucket([]byte("statedb")).Put([]byte("version"), []byte(v)) })
}

func withRecord(t *testing.T, b []byte, id string, rec []byte) []byte {
	return edited(t, b, func(tx *bbolt.Tx) error { return tx.Bucket([]byte("driver.networks")).Put([]byte(id), rec) })
}

func readRecord(t *testing.T, path, id string) []byte {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var out []byte
	_ = db.View(func(tx *bbolt.Tx) error {
		out = bytes.Clone(tx.Bucket([]byte("driver.networks")).Get([]byte(id)))
		return nil
	})
	return out
}
