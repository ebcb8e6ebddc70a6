package driver

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/internal/hwaddr"
	"github.com/overlay-plugin/overlay-plugin/kernel"
)

// Docker replays nothing to a restarted plugin: after `docker plugin
// disable`/`enable` or an upgrade, the containers it had joined are still
// attached, and Docker's next calls about them are their Leave and
// DeleteEndpoint. So the driver keeps its networks and endpoints in the
// state database and resumes them at start, adopting the sandboxes that
// survived (see New).

var (
	bucketNetworks  = []byte("driver.networks")
	bucketEndpoints = []byte("driver.endpoints")
)

// netRecord is a network as stored.
type netRecord struct {
	ID        string         `json:"id"`
	VNI       uint32         `json:"vni"`
	MTUOption int            `json:"mtuOption,omitempty"`
	Encrypted bool           `json:"encrypted,omitempty"`
	Flood     bool           `json:"flood,omitempty"`
	Subnets   []netip.Prefix `json:"subnets"`
	// Gateways are the pools' gateways; a record of an earlier release
	// has none.
	Gateways []netip.Addr `json:"gateways,omitempty"`
	// SandboxMTU is the MTU of the sandbox while it exists.
	SandboxMTU int `json:"sandboxMTU,omitempty"`
}

// epRecord is an endpoint as stored.
type epRecord struct {
	Network string         `json:"network"`
	ID      string         `json:"id"`
	MAC     hwaddr.MAC     `json:"mac"`
	Addrs   []netip.Prefix `json:"addrs"`
	Joined  bool           `json:"joined,omitempty"`
	Veth    kernel.Veth    `json:"veth"`
	// SandboxKey is the joined container's namespace, where its service
	// VIPs are programmed.
	SandboxKey string `json:"sandboxKey,omitempty"`
}

// store persists the driver's objects; a nil db persists nothing (tests).
// Writes go through w, which commits concurrent ones together; callers
// hold the network's lock and wait for the commit, so each network's
// records change in the order its operations happen.
type store struct {
	db *bbolt.DB
	w  *groupCommit
}

func newStore(db *bbolt.DB) store { return store{db: db, w: &groupCommit{db: db}} }

func (s store) init() error {
	if s.db == nil {
		return nil
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketNetworks, bucketEndpoints} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s store) put(bucket []byte, key string, v any) error {
	if s.db == nil {
		return nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	err = s.w.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), data) })
	if err != nil {
		return fmt.Errorf("persist %s: %w", key, err)
	}
	return nil
}

func (s store) putNetwork(n *network) error {
	return s.put(bucketNetworks, n.id, netRecord{ID: n.id, VNI: n.vni, MTUOption: n.opts.mtu, Encrypted: n.opts.encrypted,
		Flood: n.opts.flood, Subnets: n.subnets, Gateways: n.gateways, SandboxMTU: n.mtu})
}

func epKey(nid, eid string) string { return nid + "/" + eid }

func (s store) putEndpoint(nid string, ep *endpoint) error {
	return s.put(bucketEndpoints, epKey(nid, ep.id), epRecord{Network: nid, ID: ep.id, MAC: ep.mac, Addrs: ep.addrs,
		Joined: ep.joined, Veth: ep.veth, SandboxKey: ep.sandboxKey})
}

func (s store) deleteEndpoint(nid, eid string) error {
	if s.db == nil {
		return nil
	}
	return s.w.update(func(tx *bbolt.Tx) error { return tx.Bucket(bucketEndpoints).Delete([]byte(epKey(nid, eid))) })
}

// deleteNetwork removes the network and its endpoints.
func (s store) deleteNetwork(nid string) error {
	if s.db == nil {
		return nil
	}
	return s.w.update(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketEndpoints).Cursor()
		prefix := []byte(nid + "/")
		for k, _ := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketNetworks).Delete([]byte(nid))
	})
}

// decodeRecord decodes one JSON record strictly: a field this build does
// not know means a record written by another (newer) schema, or damage,
// and reading it anyway would act on half of it.
func decodeRecord(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the record")
	}
	return nil
}

// load reads every network and its endpoints. A record that does not
// decode (or has fields this build does not know) is reported, skipped and
// left in the database as it is: one bad record must not stop the plugin,
// and the sandbox of a network whose record is unreadable is adopted from
// the kernel (restore.go). partial are the networks with an unreadable
// endpoint record.
func (s store) load() (nets []netRecord, eps map[string][]epRecord, partial map[string]bool, errs []error) {
	eps, partial = map[string][]epRecord{}, map[string]bool{}
	if s.db == nil {
		return nil, eps, partial, nil
	}
	_ = s.db.View(func(tx *bbolt.Tx) error {
		_ = tx.Bucket(bucketNetworks).ForEach(func(k, v []byte) error {
			var r netRecord
			if err := decodeRecord(v, &r); err != nil || r.ID != string(k) || r.VNI == 0 {
				errs = append(errs, fmt.Errorf("stored network %q is unreadable: %v", k, cmp.Or(err, errors.New("wrong id or no VNI"))))
				return nil
			}
			nets = append(nets, r)
			return nil
		})
		return tx.Bucket(bucketEndpoints).ForEach(func(k, v []byte) error {
			var r epRecord
			if err := decodeRecord(v, &r); err != nil || epKey(r.Network, r.ID) != string(k) {
				errs = append(errs, fmt.Errorf("stored endpoint %q is unreadable: %v", k, cmp.Or(err, errors.New("wrong id"))))
				nid, _, _ := strings.Cut(string(k), "/")
				partial[nid] = true
				return nil
			}
			eps[r.Network] = append(eps[r.Network], r)
			return nil
		})
	})
	return nets, eps, partial, errs
}
