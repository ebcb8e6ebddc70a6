package driver

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/encryption/fakexfrm"
	"github.com/overlay-plugin/overlay-plugin/internal/countmap"
	"github.com/overlay-plugin/overlay-plugin/kernel/fakekernel"
)

// fakeEncryption counts references the way encryption.Manager does.
type fakeEncryption struct {
	unsupported error
	resumed     bool
	// inherited are the VNIs the previous run's firewall rules guard.
	inherited []uint32
	// mu guards refs and vnis. Leaf lock, taken under network locks.
	mu   sync.Mutex
	refs countmap.Map[netip.Addr]
	vnis countmap.Map[uint32]
}

func newFakeEncryption() *fakeEncryption {
	return &fakeEncryption{refs: countmap.Map[netip.Addr]{}, vnis: countmap.Map[uint32]{}}
}

func (f *fakeEncryption) Supported() error { return f.unsupported }
func (f *fakeEncryption) Overhead() int    { return encryption.Overhead }
func (f *fakeEncryption) Resumed() bool    { return f.resumed }
func (f *fakeEncryption) Inherited(v uint32) bool {
	return slices.Contains(f.inherited, v)
}
func (f *fakeEncryption) EnableVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vnis.Add(v, 1)
	return nil
}
func (f *fakeEncryption) DisableVNI(v uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vnis.Add(v, -1)
	return nil
}
func (f *fakeEncryption) AddRemote(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refs.Add(a, 1)
	return nil
}
func (f *fakeEncryption) RemoveRemote(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs.Add(a, -1) < 0 {
		return errors.New("reference dropped below zero")
	}
	return nil
}
func (f *fakeEncryption) snapshot() (map[netip.Addr]int, map[uint32]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, v := map[netip.Addr]int{}, map[uint32]int{}
	for k, n := range f.refs {
		r[k] = n
	}
	for k, n := range f.vnis {
		v[k] = n
	}
	return r, v
}

func encryptedReq(id string, v uint32) *api.CreateNetworkRequest {
	req := createNetReq(id, v)
	req.Options[genericOptionsKey].(map[string]any)[OptEncrypted] = ""
	return req
}

func newEncryptedDriver(t *testing.T, enc Encryption) (*Driver, *fakekernel.Kernel) {
	k := fakekernel.New()
	d := newTestDriver(t, k)
	d.SetEncryption(enc)
	return d, k
}

// A host that cannot encrypt refuses the network where Docker shows the
// reason on the task (CreateNetwork on each host), not at allocation on the
// manager, which swarm does asynchronously; the refusal is remembered for
// the operator.
func TestEncryptedNetworkNeedsSecretAndKernel(t *testing.T) {
	d, _ := newFake(t) // no Encryption configured
	if _, err := d.AllocateNetwork(&api.AllocateNetworkRequest{NetworkID: "n1", Options: map[string]string{OptEncrypted: ""}}); err != nil {
		t.Fatalf("allocate an encrypted network on a manager without a secret: %v", err)
	}
	for range 2 {
		if err := d.CreateNetwork(encryptedReq("n1", 300)); err == nil || !strings.Contains(err.Error(), "--secret-file") {
			t.Fatalf("CreateNetwork of an encrypted network without a secret: %v", err)
		}
	}
	st := d.State()
	if len(st) != 1 || st[0].ID != "n1" || st[0].Refused == nil || st[0].Refused.Count != 2 ||
		!strings.Contains(st[0].Refused.Reason, "--secret-file") || st[0].Sandbox != "" || len(st[0].Endpoints) != 0 {
		t.Fatalf("state after two refusals: %+v", st)
	}
	// `docker network rm` of the refused network succeeds and forgets it;
	// a second delete, of a network nobody knows, is an error again.
	must(t, d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}))
	if st := d.State(); len(st) != 0 {
		t.Fatalf("state after deleting the refused network: %+v", st)
	}
	if err := d.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: "n1"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting it again: %v, want not found", err)
	}

	fe := newFakeEncryption()
	fe.unsupported = fakexfrm.NoESPError()
	d2, k := newEncryptedDriver(t, fe)
	if err := d2.CreateNetwork(encryptedReq("n1", 300)); err == nil || !strings.Contains(err.Error(), "ESP") {
		t.Fatalf("encrypted network on a kernel without ESP: %v", err)
	}
	if st := d2.State(); len(st) != 1 || st[0].Refused == nil || !strings.Contains(st[0].Refused.Reason, "ESP") {
		t.Fatalf("state: %+v", st)
	}
	if sb, _ := k.Sandboxes(); len(sb) != 0 {
		t.Fatalf("sandboxes after a refusal: %v", sb)
	}

	// Served once the host can: the refusal is forgotten.
	fe.unsupported = nil
	must(t, d2.CreateNetwork(encryptedReq("n1", 300)))
	if st := d2.State(); len(st) != 1 || st[0].Refused != nil {
		t.Fatalf("state after the network was created: %+v", st[0].Refused)
	}
}

func TestRefusalsAreBounded(t *testing.T) {
	var r refusals
	t0 := time.Unix(1000, 0)
	for i := range maxRefusals + 5 {
		r.record(fmt.Sprintf("n%03d", i), errors.New("no"), t0.Add(time.Duration(i)*time.Second))
	}
	l := r.list()
	if len(l) != maxRefusals || l[0].id != "n005" {
		t.Fatalf("kept %d refusals, first %s: want %d from n005", len(l), l[0].id, maxRefusals)
	}
}

func TestEncryptedNetworkReferencesRemotes(t *testing.T) {
	fe := newFakeEncryption()
	d, k := newEncryptedDriver(t, fe)
	must(t, d.CreateNetwork(encryptedReq("n1", 300)))
	must(t, d.CreateNetwork(encryptedReq("n2", 301)))
	must(t, d.CreateNetwork(createNetReq("n3", 302))) // plain: no references
	for _, n := range []string{"n1", "n2", "n3"} {
		_, err := d.CreateEndpoint(endpointReq(n, "e"+n, 1))
		must(t, err)
		_, err = d.Join(&api.JoinRequest{NetworkID: n, EndpointID: "e" + n})
		must(t, err)
	}
	if got := k.Snapshot()["n1"].Spec.MTU; got != 1450-encryption.Overhead {
		t.Fatalf("encrypted MTU %d, want %d", got, 1450-encryption.Overhead)
	}
	if got := k.Snapshot()["n3"].Spec.MTU; got != 1450 {
		t.Fatalf("plain MTU %d", got)
	}
	vtepB := "198.51.100.2"
	must(t, d.AddPeer("n1", remotePeer("r1", "10.1.0.50", "02:00:00:00:00:50", vtepB)))
	must(t, d.AddPeer("n1", remotePeer("r2", "10.1.0.51", "02:00:00:00:00:51", vtepB)))
	must(t, d.AddPeer("n2", remotePeer("r3", "10.1.0.52", "02:00:00:00:00:52", vtepB)))
	must(t, d.AddPeer("n3", remotePeer("r4", "10.1.0.53", "02:00:00:00:00:53", vtepB)))
	refs, vnis := fe.snapshot()
	b := netip.MustParseAddr(vtepB)
	if refs[b] != 2 || len(refs) != 1 {
		t.Fatalf("refs %v: want one per encrypted network reaching %s", refs, b)
	}
	if vnis[300] != 1 || vnis[301] != 1 || vnis[302] != 0 {
		t.Fatalf("guarded VNIs %v", vnis)
	}
	must(t, d.DeletePeer("n1", "r1"))
	if refs, _ := fe.snapshot(); refs[b] != 2 {
		t.Fatalf("reference dropped while n1 still reaches %s: %v", b, refs)
	}
	must(t, d.DeletePeer("n1", "r2"))
	if refs, _ := fe.snapshot(); refs[b] != 1 {
		t.Fatalf("refs after n1's last peer: %v", refs)
	}
	must(t, d.Leave(&api.LeaveRequest{NetworkID: "n2", EndpointID: "en2"}))
	refs, vnis = fe.snapshot()
	if len(refs) != 0 || vnis[301] != 0 || vnis[300] != 1 {
		t.Fatalf("after n2's sandbox went: refs %v vnis %v", refs, vnis)
	}
}
