package main

import (
	"log/slog"
	"net/netip"

	"github.com/overlay-plugin/overlay-plugin/internal/nftutil"
)

// openSourceFilter builds the VXLAN source filter and takes over the
// table a previous run left, before the driver adopts that run's
// sandboxes: their traffic is filtered, and admitted, without a gap. It
// returns nil when the filter is off (the previous table is removed) or
// nf_tables is missing; both are said in the log, as unencrypted networks
// then take VXLAN from anyone.
func openSourceFilter(cfg serveConfig, deps serveDeps, log *slog.Logger) sourceFilter {
	if deps.newSourceFilter == nil {
		return nil
	}
	f := deps.newSourceFilter()
	if !cfg.VXLANFilter {
		log.Warn("VXLAN source filter off", "why", "--vxlan-filter=false (OVERLAY_VXLAN_FILTER): UNSAFE, anyone who reaches the VXLAN port can send into unencrypted networks")
		if err := f.Close(); err != nil {
			log.Warn("remove the previous run's VXLAN source filter", "err", err)
		}
		return nil
	}
	if err := nftutil.Available(); err != nil {
		log.Error("VXLAN source filter unavailable", "why", "this kernel serves no nf_tables: unencrypted networks take VXLAN from anyone who reaches the port", "err", err)
		return nil
	}
	vnis, vteps, err := f.Keep()
	switch {
	case err != nil:
		log.Warn("previous VXLAN source filter unreadable", "why", "it is rebuilt from this run's state", "err", err)
	case vnis > 0:
		log.Info("VXLAN source filter taken over", "why", "a previous run's sources stay admitted until this run has heard from the cluster",
			"vnis", vnis, "sources", vteps)
	}
	return f
}

// memberVTEPs feeds the live members' VTEPs to the filter; nil without one.
func memberVTEPs(f sourceFilter, log *slog.Logger) func([]netip.Addr) {
	if f == nil {
		return nil
	}
	return func(vteps []netip.Addr) {
		if err := f.SetMembers(vteps); err != nil {
			log.Warn("VXLAN source filter members", "why", "the periodic repair retries", "members", len(vteps), "err", err)
		}
	}
}
