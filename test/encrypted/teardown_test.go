package encrypted

// 6. Teardown leaves nothing behind.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/docker/go-plugins-helpers/network"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
	"github.com/overlay-plugin/overlay-plugin/internal/wait"
)

// leftovers lists the IPsec and nftables state left on n.
func (s *suite) leftovers(n *testbed.Node, checkAPI bool) error {
	var problems []string
	ks, out, err := n.NS.XfrmStates()
	if err != nil {
		return err
	}
	if len(ks) != 0 {
		problems = append(problems, "xfrm states:\n"+out)
	}
	pols, pout, err := n.NS.XfrmPolicies()
	if err != nil {
		return err
	}
	for _, p := range pols {
		if p.HasMark && p.Mark == encryption.Mark {
			problems = append(problems, "our xfrm policy:\n"+p.Text)
		}
	}
	if len(pols) != 0 && !slices.ContainsFunc(problems, func(s string) bool { return strings.HasPrefix(s, "our") }) {
		problems = append(problems, "foreign xfrm policies (nobody else runs IPsec here):\n"+pout)
	}
	tables, err := testbed.NftTables(n.NS.Path())
	if err != nil {
		return err
	}
	if slices.Contains(tables, "inet overlay_plugin") {
		problems = append(problems, fmt.Sprintf("nftables tables %v", tables))
	}
	if checkAPI {
		st, err := n.Plugin.EncryptionStatus()
		if err != nil {
			return err
		}
		if len(st.VNIs) != 0 || len(st.States) != 0 {
			problems = append(problems, "admin API: "+testbed.DumpStatus(st))
		}
		for _, r := range st.Remotes {
			if r.Refs != 0 || r.SAs != 0 || r.PolicySPI != 0 || r.Blocked {
				problems = append(problems, fmt.Sprintf("admin API remote %+v", r))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s:\n%s", n.Name, strings.Join(problems, "\n"))
	}
	return nil
}

func (s *suite) phaseTeardown(t *testing.T) {
	// What dockerd does as containers stop and the networks go; the hosts
	// side by side.
	err := s.ForNodes(func(n *testbed.Node) error {
		for _, ep := range s.eps {
			if ep.node != n {
				continue
			}
			if err := ep.Ctr.Detach(); err != nil {
				return fmt.Errorf("%s: %w", n.Name, err)
			}
			if err := n.Plugin.API.Leave(&api.LeaveRequest{NetworkID: ep.net.ID, EndpointID: ep.ID}); err != nil {
				return fmt.Errorf("%s Leave %s: %w", n.Name, ep.name, err)
			}
			if err := n.Plugin.API.DeleteEndpoint(&api.DeleteEndpointRequest{NetworkID: ep.net.ID, EndpointID: ep.ID}); err != nil {
				return fmt.Errorf("%s DeleteEndpoint %s: %w", n.Name, ep.name, err)
			}
		}
		for _, nw := range []*testbed.Network{s.enc, s.plain} {
			if err := n.Plugin.API.DeleteNetwork(&api.DeleteNetworkRequest{NetworkID: nw.ID}); err != nil {
				return fmt.Errorf("%s DeleteNetwork %s: %w", n.Name, nw.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, nw := range []*testbed.Network{s.enc, s.plain} {
		if err := s.Nodes[0].Plugin.API.FreeNetwork(&api.FreeNetworkRequest{NetworkID: nw.ID}); err != nil {
			t.Fatalf("FreeNetwork %s: %v", nw.Name, err)
		}
	}
	err = s.ForNodes(func(n *testbed.Node) error {
		var errs []error
		if err := wait.Until(30*time.Second+encryption.Linger, poll, func() error { return s.leftovers(n, true) }); err != nil {
			errs = append(errs, fmt.Errorf("no IPsec or firewall state left: %w", err))
		}
		if nets, err := n.Plugin.Admin.Networks(); err != nil || len(nets) != 0 {
			errs = append(errs, fmt.Errorf("%s: networks %+v, %v; want none", n.Name, nets, err))
		}
		if extra, err := n.ExtraLinks(); err != nil || len(extra) != 0 {
			errs = append(errs, fmt.Errorf("%s: links left in the host namespace: %v, %v", n.Name, extra, err))
		}
		// A clean stop must not leave anything either.
		if err := n.Plugin.Stop(0); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop plugin: %w", n.Name, err))
		}
		if err := s.leftovers(n, false); err != nil {
			errs = append(errs, fmt.Errorf("after stopping the plugin: %w", err))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Error(err)
	}
}
