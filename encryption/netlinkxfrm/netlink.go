// Package netlinkxfrm is the encryption.XFRM that programs the running
// kernel over xfrm netlink.
package netlinkxfrm

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/encryption"
	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
	"github.com/overlay-plugin/overlay-plugin/internal/netlinkutil"
	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
)

// The probe SA Check adds and removes. Loopback addresses are never a pair
// of VTEPs, so the probe can neither collide with nor be used by a real
// policy; it carries ReqID so that Flush removes it should the process die
// between adding and deleting it.
var (
	probeSrc = netip.MustParseAddr("127.0.0.1")
	probeDst = netip.MustParseAddr("127.0.0.2")
)

const probeSPI = 0x0E5CFFFF

// XFRM implements encryption.XFRM with xfrm netlink in one network
// namespace. It only ever touches states carrying encryption.ReqID and
// policies carrying encryption.Mark (with a full mask), so it coexists with
// Docker's overlay (mark 0xD0C4E3) and any other IPsec user of the
// namespace.
type XFRM struct {
	// mu guards h: it serialises requests on the one netlink socket and
	// Close. It is a leaf lock: nothing else is locked while it is held.
	mu lockrank.Mutex[lockrank.XFRM]
	h  *netlink.Handle // nil once closed
}

var _ encryption.XFRM = (*XFRM)(nil)

// New opens an xfrm netlink socket in ns; the zero handle or
// netns.None() means the caller's current namespace. The namespace handle
// may be closed once this returns: the socket keeps the namespace.
func New(ns netns.NsHandle) (*XFRM, error) {
	if ns == 0 {
		ns = netns.None()
	}
	h, err := nsthread.Open(ns, func() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_XFRM) })
	if err != nil {
		return nil, fmt.Errorf("xfrm: open netlink socket: %w", err)
	}
	return &XFRM{h: h}, nil
}

// Close releases the netlink socket; installed states and policies stay.
func (x *XFRM) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.h != nil {
		x.h.Close()
		x.h = nil
	}
	return nil
}

var errClosed = errors.New("xfrm: handle is closed")

// do runs f with the handle under the lock.
func (x *XFRM) do(f func(h *netlink.Handle) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.h == nil {
		return errClosed
	}
	return f(x.h)
}

// pair validates src and dst and returns them as net.IPs of one family.
func pair(src, dst netip.Addr) (net.IP, net.IP, error) {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() {
		return nil, nil, fmt.Errorf("xfrm: invalid address pair %v -> %v", src, dst)
	}
	if src.Is4() != dst.Is4() {
		return nil, nil, fmt.Errorf("xfrm: address families differ: %v -> %v", src, dst)
	}
	return net.IP(src.AsSlice()), net.IP(dst.AsSlice()), nil
}

func hostNet(ip net.IP) *net.IPNet {
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(len(ip)*8, len(ip)*8)}
}

// toAddr converts what netlink returns (IPv4 as 16-byte mapped) to netip.
func toAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// unsupported reports kernel errors that mean "no ESP or no such AEAD":
// EPROTONOSUPPORT "Requested type not found" (no esp4/esp6), ENOSYS
// "AEAD algorithm not found" (no gcm / rfc4106), ENOENT and EOPNOTSUPP from
// crypto allocation.
func unsupported(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOSYS) ||
		errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) ||
		errors.Is(err, unix.EAFNOSUPPORT)
}

// kernelHint names, for the errnos xfrm_user returns, the message the
// kernel attaches (which vishvananda/netlink does not request).
func kernelHint(err error) string {
	switch {
	case errors.Is(err, unix.EPROTONOSUPPORT):
		return " (Requested type not found: no ESP transform)"
	case errors.Is(err, unix.ENOSYS):
		return " (AEAD algorithm not found)"
	}
	return ""
}

func noESP(err error) error {
	return fmt.Errorf("%w: load esp4/esp6 and gcm modules or use a kernel that has them: %w%s",
		encryption.ErrNoESP, err, kernelHint(err))
}

func espState(sa encryption.SA) (*netlink.XfrmState, error) {
	src, dst, err := pair(sa.Src, sa.Dst)
	if err != nil {
		return nil, err
	}
	if len(sa.Key) != encryption.KeyLen {
		return nil, fmt.Errorf("xfrm: SA %v: key is %d bytes, want %d", sa.Direction, len(sa.Key), encryption.KeyLen)
	}
	if sa.SPI < 256 {
		return nil, fmt.Errorf("xfrm: SA %v: SPI %#x is reserved", sa.Direction, sa.SPI)
	}
	return &netlink.XfrmState{
		Src:          src,
		Dst:          dst,
		Proto:        netlink.XFRM_PROTO_ESP,
		Mode:         netlink.XFRM_MODE_TRANSPORT,
		Spi:          int(sa.SPI),
		Reqid:        encryption.ReqID,
		Aead:         &netlink.XfrmStateAlgo{Name: encryption.AEADName, Key: sa.Key, ICVLen: encryption.ICVBits},
		ESN:          true,
		ReplayWindow: encryption.ReplayWindow,
	}, nil
}

// Check adds and removes a probe SA to learn whether the kernel has ESP
// with AEADName.
func (x *XFRM) Check() error {
	return x.do(func(h *netlink.Handle) error {
		st, err := espState(encryption.SA{
			Direction: encryption.Direction{Src: probeSrc, Dst: probeDst},
			SPI:       probeSPI,
			Key:       make([]byte, encryption.KeyLen),
		})
		if err != nil {
			return err
		}
		_ = h.XfrmStateDel(st) // a probe left by a crash; usually absent
		if err := h.XfrmStateAdd(st); err != nil {
			if unsupported(err) {
				return noESP(err)
			}
			return fmt.Errorf("xfrm: add probe SA: %w", err)
		}
		if err := h.XfrmStateDel(st); err != nil {
			return fmt.Errorf("xfrm: delete probe SA %v -> %v spi %#x: %w", probeSrc, probeDst, probeSPI, err)
		}
		return nil
	})
}

// AddSA installs sa. If the kernel already has a state for (dst, SPI) that
// is the same SA (same source, ours, same key) nothing changes; a different
// one is an SPI collision and an error, since the kernel identifies states
// by (dst, SPI) alone and would otherwise keep using the wrong key.
func (x *XFRM) AddSA(sa encryption.SA) error {
	st, err := espState(sa)
	if err != nil {
		return err
	}
	return x.do(func(h *netlink.Handle) error {
		err := h.XfrmStateAdd(st)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EEXIST):
			old, gerr := h.XfrmStateGet(&netlink.XfrmState{Dst: st.Dst, Proto: st.Proto, Spi: st.Spi})
			if gerr != nil {
				return fmt.Errorf("xfrm: SA %v spi %#x exists but cannot be read: %w", sa.Direction, sa.SPI, gerr)
			}
			if !old.Src.Equal(st.Src) || old.Reqid != encryption.ReqID || old.Aead == nil ||
				old.Aead.Name != encryption.AEADName || !bytes.Equal(old.Aead.Key, sa.Key) {
				return fmt.Errorf("xfrm: SA %v: SPI %#x to %v is already used by another state (src %v, reqid %#x)",
					sa.Direction, sa.SPI, sa.Dst, old.Src, old.Reqid)
			}
			return nil
		case unsupported(err):
			return fmt.Errorf("xfrm: add SA %v spi %#x: %w", sa.Direction, sa.SPI, noESP(err))
		default:
			return fmt.Errorf("xfrm: add SA %v spi %#x: %w", sa.Direction, sa.SPI, err)
		}
	})
}

// missing reports the errors of deleting what is not there.
func missing(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT)
}

// DeleteSA removes the state (dst, spi) if it is ours. The kernel looks
// states up by (dst, SPI) only, so src serves to check ownership.
func (x *XFRM) DeleteSA(src, dst netip.Addr, spi uint32) error {
	s, d, err := pair(src, dst)
	if err != nil {
		return err
	}
	return x.do(func(h *netlink.Handle) error {
		id := &netlink.XfrmState{Dst: d, Proto: netlink.XFRM_PROTO_ESP, Spi: int(spi)}
		old, err := h.XfrmStateGet(id)
		if missing(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("xfrm: look up SA %v -> %v spi %#x: %w", src, dst, spi, err)
		}
		if old.Reqid != encryption.ReqID || !old.Src.Equal(s) {
			return nil // not ours: someone else's state with that SPI
		}
		if err := h.XfrmStateDel(id); err != nil && !missing(err) {
			return fmt.Errorf("xfrm: delete SA %v -> %v spi %#x: %w", src, dst, spi, err)
		}
		return nil
	})
}

// policy builds the outbound policy src→dst:port with a template for spi
// (0: any SA of ours for the pair, and there is none, so traffic is dropped).
func policy(src, dst net.IP, port uint16, spi uint32) *netlink.XfrmPolicy {
	return &netlink.XfrmPolicy{
		Src:     hostNet(src),
		Dst:     hostNet(dst),
		Proto:   netlink.Proto(unix.IPPROTO_UDP),
		DstPort: int(port),
		Dir:     netlink.XFRM_DIR_OUT,
		Mark:    &netlink.XfrmMark{Value: encryption.Mark, Mask: 0xffffffff},
		Tmpls: []netlink.XfrmPolicyTmpl{{
			Src:   src,
			Dst:   dst,
			Proto: netlink.XFRM_PROTO_ESP,
			Mode:  netlink.XFRM_MODE_TRANSPORT,
			Reqid: encryption.ReqID,
			Spi:   int(spi),
		}},
	}
}

func (x *XFRM) updatePolicy(src, dst netip.Addr, port uint16, spi uint32) error {
	s, d, err := pair(src, dst)
	if err != nil {
		return err
	}
	if port == 0 {
		return errors.New("xfrm: policy needs a destination port")
	}
	return x.do(func(h *netlink.Handle) error {
		if err := h.XfrmPolicyUpdate(policy(s, d, port, spi)); err != nil {
			return fmt.Errorf("xfrm: set policy %v -> %v:%d spi %#x: %w", src, dst, port, spi, err)
		}
		return nil
	})
}

// SetPolicy creates or replaces in place the outbound policy src→dst:port
// so that it uses the SA spi.
func (x *XFRM) SetPolicy(src, dst netip.Addr, port uint16, spi uint32) error {
	if spi == 0 {
		return errors.New("xfrm: SetPolicy needs an SPI (BlockPolicy blocks)")
	}
	return x.updatePolicy(src, dst, port, spi)
}

// BlockPolicy creates or replaces the outbound policy src→dst:port with a
// template of SPI 0 and reqid ReqID. While no state of ours exists for
// src→dst the kernel finds no SA for it and drops the packets (verified:
// nothing leaves in clear). Note that SPI 0 matches ANY state with ReqID
// for src→dst, so an outbound SA left installed for the pair would be used.
func (x *XFRM) BlockPolicy(src, dst netip.Addr, port uint16) error {
	return x.updatePolicy(src, dst, port, 0)
}

// DeletePolicy removes the outbound policy src→dst:port; missing is fine.
func (x *XFRM) DeletePolicy(src, dst netip.Addr, port uint16) error {
	s, d, err := pair(src, dst)
	if err != nil {
		return err
	}
	return x.do(func(h *netlink.Handle) error {
		if err := h.XfrmPolicyDel(policy(s, d, port, 0)); err != nil && !missing(err) {
			return fmt.Errorf("xfrm: delete policy %v -> %v:%d: %w", src, dst, port, err)
		}
		return nil
	})
}

func (x *XFRM) listStates(h *netlink.Handle) ([]netlink.XfrmState, error) {
	states, err := netlinkutil.Dump(func() ([]netlink.XfrmState, error) { return h.XfrmStateList(netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("xfrm: list states: %w", err)
	}
	var ours []netlink.XfrmState
	for _, s := range states {
		if s.Reqid == encryption.ReqID {
			ours = append(ours, s)
		}
	}
	return ours, nil
}

func ourMark(m *netlink.XfrmMark) bool {
	return m != nil && m.Value == encryption.Mark && m.Mask == 0xffffffff
}

func (x *XFRM) listPolicies(h *netlink.Handle) ([]netlink.XfrmPolicy, error) {
	pols, err := netlinkutil.Dump(func() ([]netlink.XfrmPolicy, error) { return h.XfrmPolicyList(netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("xfrm: list policies: %w", err)
	}
	var ours []netlink.XfrmPolicy
	for _, p := range pols {
		if ourMark(p.Mark) {
			ours = append(ours, p)
		}
	}
	return ours, nil
}

// States lists the states carrying ReqID, with their lifetime counters.
func (x *XFRM) States() ([]encryption.StateInfo, error) {
	var out []encryption.StateInfo
	err := x.do(func(h *netlink.Handle) error {
		states, err := x.listStates(h)
		for _, s := range states {
			out = append(out, encryption.StateInfo{
				Src:     toAddr(s.Src),
				Dst:     toAddr(s.Dst),
				SPI:     uint32(s.Spi),
				Bytes:   s.Statistics.Bytes,
				Packets: s.Statistics.Packets,
			})
		}
		return err
	})
	return out, err
}

// Policies lists the outbound policies carrying Mark.
func (x *XFRM) Policies() ([]encryption.PolicyInfo, error) {
	var out []encryption.PolicyInfo
	err := x.do(func(h *netlink.Handle) error {
		pols, err := x.listPolicies(h)
		for _, p := range pols {
			if p.Dir != netlink.XFRM_DIR_OUT || p.Src == nil || p.Dst == nil {
				continue
			}
			pi := encryption.PolicyInfo{Src: toAddr(p.Src.IP), Dst: toAddr(p.Dst.IP), Port: uint16(p.DstPort)}
			if len(p.Tmpls) > 0 {
				pi.SPI = uint32(p.Tmpls[0].Spi)
			}
			out = append(out, pi)
		}
		return err
	})
	return out, err
}

// Flush removes every state carrying ReqID and every policy carrying Mark,
// in any direction, and nothing else. It carries on past failures and
// returns them all.
func (x *XFRM) Flush() error {
	return x.do(func(h *netlink.Handle) error {
		var errs []error
		pols, err := x.listPolicies(h)
		errs = append(errs, err)
		for _, p := range pols {
			// The dump filled Index, Dir and Mark: deletion goes by index.
			if err := h.XfrmPolicyDel(&p); err != nil && !missing(err) {
				errs = append(errs, fmt.Errorf("xfrm: flush policy %v -> %v %v: %w", p.Src, p.Dst, p.Dir, err))
			}
		}
		states, err := x.listStates(h)
		errs = append(errs, err)
		for _, s := range states {
			id := &netlink.XfrmState{Dst: s.Dst, Proto: s.Proto, Spi: s.Spi, Mark: s.Mark}
			if err := h.XfrmStateDel(id); err != nil && !missing(err) {
				errs = append(errs, fmt.Errorf("xfrm: flush SA %v -> %v spi %#x: %w", s.Src, s.Dst, s.Spi, err))
			}
		}
		return errors.Join(errs...)
	})
}
