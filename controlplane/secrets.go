package controlplane

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/overlay-plugin/overlay-plugin/cluster"
	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// secretsPoll is how often the secret file is read for changes: a
// rotation step takes effect within it, without a restart (and at once on
// Reload).
const secretsPoll = 2 * time.Second

// errNoSecretFile: Reload on a plugin without a cluster secret.
var errNoSecretFile = fmt.Errorf("%w: no cluster secret: the plugin runs without --secret-file (or is still starting)", driver.ErrNotFound)

// secretFile follows the keyring file (--secret-file). A change goes to the
// IPsec manager first, which installs inbound SAs for a new secret, then to
// the gossip, which sends with the new primary and tells the members the
// secrets' ids: so no member sends with a secret before this node receives
// with it. A file that cannot be used changes nothing and is logged once.
type secretFile struct {
	path string
	log  *slog.Logger
	// reload takes Reload's requests to run's goroutine; stopped is
	// closed when it returns.
	reload  chan chan error
	stopped chan struct{}
	// seen is the digest of the file's contents last read, used or not
	// (not the contents: no copy of the secrets stays); run's.
	seen [sha256.Size]byte
	// now is what is held and the last reading's error, replaced whole by
	// run's goroutine, read by the admin view.
	now atomic.Pointer[secretsHeld]
}

type secretsHeld struct {
	ring []encryption.Secret
	err  error
}

func newSecretFile(path string, log *slog.Logger) (*secretFile, error) {
	data, err := readSecretFile(path)
	if err != nil {
		return nil, err
	}
	ring, err := encryption.LoadSecrets(path, data, log)
	if err != nil {
		return nil, err
	}
	seen := sha256.Sum256(data)
	clear(data)
	log.Info("cluster secrets loaded", "path", path, "ids", encryption.IDs(ring), "primary", ring[0].ID)
	f := &secretFile{path: path, log: log, reload: make(chan chan error), stopped: make(chan struct{}), seen: seen}
	f.now.Store(&secretsHeld{ring: ring})
	return f, nil
}

// readSecretFile reads the secret file's contents.
func readSecretFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	return data, nil
}

// held returns the secrets held now.
func (f *secretFile) held() []encryption.Secret { return f.now.Load().ring }

// gossipKeys are the secrets' gossip keys, primary first.
func gossipKeys(ring []encryption.Secret) [][]byte {
	out := make([][]byte, len(ring))
	for i, s := range ring {
		out[i] = encryption.Subkey(s.Key, encryption.UseGossip)
	}
	return out
}

// run reads the file every secretsPoll and on Reload until ctx ends, and
// hands a changed keyring to apply.
func (f *secretFile) run(ctx context.Context, apply func([]encryption.Secret) error) {
	defer close(f.stopped)
	t := time.NewTicker(secretsPoll)
	defer t.Stop()
	for {
		var reply chan error
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case reply = <-f.reload:
		}
		err := f.check(apply, reply != nil)
		if reply != nil {
			reply <- err
		}
	}
}

// check reads the file and applies a changed keyring. A file as it was is
// left alone unless the last reading failed (a refusal by apply may pass
// later) or forced (Reload); the same error is logged once.
func (f *secretFile) check(apply func([]encryption.Secret) error, forced bool) error {
	data, err := readSecretFile(f.path)
	defer clear(data)
	sum := sha256.Sum256(data)
	same := err == nil && sum == f.seen
	if err == nil {
		f.seen = sum
	}
	held := f.held()
	if same && !forced && f.now.Load().err == nil {
		return nil
	}
	var ring []encryption.Secret
	if err == nil {
		ring, err = encryption.LoadSecrets(f.path, data, f.log)
	}
	if err == nil && !slices.Equal(encryption.IDs(ring), encryption.IDs(held)) {
		err = apply(ring)
	} else if err == nil {
		ring = held // formatting only
	}
	prev := f.now.Load().err
	if err != nil {
		f.now.Store(&secretsHeld{ring: held, err: err})
		if forced || prev == nil || prev.Error() != err.Error() {
			f.log.Error("secret file refused", "why", "the secrets held stay in use", "path", f.path, "held", encryption.IDs(held), "err", err)
		}
		return fmt.Errorf("%w: secret file refused, the secrets held (%v) stay in use: %w", driver.ErrInvalid, encryption.IDs(held), err)
	}
	f.now.Store(&secretsHeld{ring: ring})
	if !slices.Equal(encryption.IDs(ring), encryption.IDs(held)) {
		f.log.Info("cluster secrets loaded", "path", f.path, "ids", encryption.IDs(ring), "primary", ring[0].ID, "before", encryption.IDs(held))
	}
	return nil
}

// applySecrets is the Plane's apply: the IPsec manager, then the gossip.
func (p *Plane) applySecrets(ring []encryption.Secret) error {
	if p.enc != nil {
		if err := p.enc.SetSalts(encryption.Salts(ring)); err != nil {
			return err
		}
	}
	keys := gossipKeys(ring)
	return p.cluster.SetKeys(keys[0], keys[1:], encryption.IDs(ring))
}

// Reload reads the secret file now (overlay-plugin reload) and says
// whether its secrets are in use.
func (p *Plane) Reload(ctx context.Context) error {
	if p == nil || p.secrets == nil {
		return errNoSecretFile
	}
	reply := make(chan error, 1)
	select {
	case p.secrets.reload <- reply:
	case <-p.secrets.stopped:
		return fmt.Errorf("%w: the control plane has stopped", driver.ErrNotFound)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// peerSecrets hands a member's secret ids to the IPsec manager.
func (p *Plane) peerSecrets(vtep netip.Addr, ids []string) {
	if err := p.enc.SetPeerSecrets(vtep, ids); err != nil {
		p.log.Warn("program IPsec for a member's secrets", "remote", vtep, "err", err)
	}
}

// SecretsStatus is the keyring as this node sees it: its own secrets, and
// each live member's with the one their IPsec traffic uses.
func (p *Plane) SecretsStatus() (encryption.SecretsStatus, bool) {
	if p == nil || p.secrets == nil || p.cluster == nil {
		return encryption.SecretsStatus{}, false
	}
	now := p.secrets.now.Load()
	st := encryption.SecretsStatus{Held: encryption.IDs(now.ring), Members: []encryption.MemberSecrets{}}
	if now.err != nil {
		st.FileError = now.err.Error()
	}
	var pair map[netip.Addr]string
	if p.enc != nil {
		pair = p.enc.PairSecrets()
	}
	for _, m := range p.cluster.Members() {
		if m.Self || m.State != cluster.MemberAlive {
			continue
		}
		st.Members = append(st.Members, encryption.MemberSecrets{Name: m.Name, VTEP: m.VTEP, Secrets: m.KeyIDs,
			LacksPrimary: len(m.KeyIDs) > 0 && !slices.Contains(m.KeyIDs, st.Held[0]), PairSecret: pair[m.VTEP]})
	}
	return st, true
}
