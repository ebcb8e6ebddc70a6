package encryption

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

// NodeData is where the public keys go to reach the other hosts: the
// gossip cluster's data of this node (cluster.Cluster.SetNodeData). It must
// not block: it is called under the encryption mutex.
type NodeData interface {
	SetNodeData(data []byte) error
}

// Publisher carries the manager's public keys (Config.Publish) to the
// other hosts, at once, and to the key store for the next run. The manager
// publishes under its mutex, so the disk write (an fsync) is left to Run:
// no Join waits for it.
type Publisher struct {
	store KeyStore
	vtep  netip.Addr
	log   *slog.Logger
	// dirty (capacity 1) tells Run that latest is not stored yet.
	dirty chan struct{}

	// mu guards latest, encoded and node. A leaf, taken under the
	// encryption mutex.
	mu      lockrank.Mutex[lockrank.Publisher]
	latest  []PublicKey
	encoded []byte
	node    NodeData
}

// NewPublisher returns a publisher storing keys published for vtep.
func NewPublisher(store KeyStore, vtep netip.Addr, log *slog.Logger) *Publisher {
	return &Publisher{store: store, vtep: vtep, log: log, dirty: make(chan struct{}, 1)}
}

// Publish is the manager's Config.Publish.
func (p *Publisher) Publish(keys []PublicKey) {
	b, err := EncodePublicKeys(keys)
	if err != nil {
		p.log.Error("encode public keys", "err", err)
		return
	}
	p.mu.Lock()
	p.latest, p.encoded = slices.Clone(keys), b
	if p.node != nil {
		if err := p.node.SetNodeData(b); err != nil {
			p.log.Error("publish public keys", "err", err)
		}
	}
	p.mu.Unlock()
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

// Attach sets where the keys go from now on, and sends the latest there.
// The cluster exists only after the manager, which publishes as it starts.
func (p *Publisher) Attach(n NodeData) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.node = n
	if p.encoded != nil {
		if err := n.SetNodeData(p.encoded); err != nil {
			p.log.Error("publish public keys", "err", err)
		}
	}
}

// Run stores the latest keys whenever they change, until ctx ends, and
// stores what is still pending before it returns.
func (p *Publisher) Run(ctx context.Context) {
	for {
		select {
		case <-p.dirty:
			p.save()
		case <-ctx.Done():
			select {
			case <-p.dirty:
				p.save()
			default:
			}
			return
		}
	}
}

func (p *Publisher) save() {
	p.mu.Lock()
	keys := p.latest
	p.mu.Unlock()
	if err := p.store.Save(p.vtep, keys); err != nil {
		p.log.Error("store public keys for the next run", "err", err)
	}
}
