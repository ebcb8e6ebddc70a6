package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"go.etcd.io/bbolt"

	"github.com/overlay-plugin/overlay-plugin/cluster"
)

// The VXLAN port. Every node must use the same (the kernel sends to the
// port of the local device), so a node given no --vxlan-port follows the
// cluster, and the cluster follows Docker's swarm data-path port:
//
//  1. the setting, when given;
//  2. the port a previous run settled (state.db), so that a restart
//     keeps its sandboxes' devices and its peers;
//  3. 4789 for a node whose state.db holds none although it exists: it
//     ran 0.1.0, which used 4789 whatever Docker's port, and its 0.1.0
//     peers still do;
//  4. on a first run, the port the members already use, as they tell it
//     in their settings (those following Docker's first): the node joins
//     and waits for them up to managerWait, or workerWait on a swarm
//     worker, which has nothing else to go by;
//  5. Docker's data-path port, which a manager's engine says (a worker's
//     does not);
//  6. 4789.
//
// 4 to 6 are stored for the next run. A node is said to follow the swarm
// (cluster.Settings.Swarm) when its port came from Docker, itself or
// through a member.

// DefaultVXLANPort is Docker's and the IANA's VXLAN port.
const DefaultVXLANPort = 4789

const (
	// managerWait and workerWait bound the first run's wait for the
	// members' settings, which they send as soon as they see the node.
	// A worker has nothing else to go by; both stay well below the
	// driver's wait for the data path (vtepWait, 20 s).
	managerWait = 2 * time.Second
	workerWait  = 10 * time.Second
)

var (
	portBucket = []byte("controlplane")
	portKey    = []byte("vxlan-port")
)

// PortChoice is a settled VXLAN port and where it came from.
type PortChoice struct {
	Port uint16 `json:"port"`
	// Swarm: Port is Docker's data-path port (cluster.Settings.Swarm).
	Swarm bool `json:"swarm,omitempty"`
	// Source says where it came from, for the log.
	Source string `json:"-"`
}

// StartPort is the port known before the cluster is joined: the setting
// (explicit, 0 if none), else the stored one, else 4789 for a state
// database that existed before this run (rules 1-3 above; the 4789 is
// stored). A zero Port: the control plane settles it (SettleFirstRun).
func StartPort(db *bbolt.DB, explicit uint16, dbExisted bool) (PortChoice, error) {
	if explicit != 0 {
		return PortChoice{Port: explicit, Source: "setting"}, nil
	}
	stored, err := loadPort(db)
	if err != nil || stored.Port != 0 {
		stored.Source = "state"
		return stored, err
	}
	if !dbExisted {
		return PortChoice{}, nil
	}
	pc := PortChoice{Port: DefaultVXLANPort, Source: "previous release"}
	return pc, storePort(db, pc)
}

func loadPort(db *bbolt.DB) (PortChoice, error) {
	var pc PortChoice
	err := db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(portBucket)
		if b == nil {
			return nil
		}
		v := b.Get(portKey)
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(v, &pc); err != nil || pc.Port == 0 {
			return fmt.Errorf("stored VXLAN port %q unreadable", v)
		}
		return nil
	})
	return pc, err
}

func storePort(db *bbolt.DB, pc PortChoice) error {
	v, err := json.Marshal(pc)
	if err != nil {
		return err
	}
	return db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(portBucket)
		if err != nil {
			return err
		}
		return b.Put(portKey, v)
	})
}

// clusterPort is what settleFirstRun needs of the cluster.
type clusterPort interface {
	ClusterPort() (port uint16, member string, swarm, ok bool)
}

// settleFirstRun is rules 4 to 6: the members' port if one tells it
// within the wait, else Docker's (dp, when manager: this node's engine
// said it), else 4789. c is nil without gossip. A swarm worker (an engine
// that says no port) waits longest; a node without an engine is on no
// swarm, has no Docker port to follow, and waits as long as a manager.
func settleFirstRun(ctx context.Context, c clusterPort, dp uint16, manager, engine bool, log *slog.Logger) PortChoice {
	if c == nil {
		if manager {
			return PortChoice{Port: dp, Swarm: true, Source: "Docker's data-path port"}
		}
		return PortChoice{Port: DefaultVXLANPort, Source: "default"}
	}
	wait := managerWait
	if engine && !manager {
		wait = workerWait
	}
	deadline := time.Now().Add(wait)
	for {
		if port, member, swarm, ok := c.ClusterPort(); ok {
			return PortChoice{Port: port, Swarm: swarm || (manager && port == dp), Source: "member " + member}
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if manager {
		return PortChoice{Port: dp, Swarm: true, Source: "Docker's data-path port"}
	}
	log.Info("VXLAN port defaulted", "port", DefaultVXLANPort,
		"why", "no member told its port within "+wait.String()+" and no engine here says the swarm's (a worker's does not)")
	return PortChoice{Port: DefaultVXLANPort, Source: "default"}
}

// settingsOf is what this node tells the members.
func settingsOf(pc PortChoice, underMTU int) cluster.Settings {
	return cluster.Settings{VXLANPort: pc.Port, UnderlayMTU: underMTU, Swarm: pc.Swarm}
}
