package kernel

// Program: neighbour and FDB changes pipelined on one rtnetlink socket.
// A request per round trip (vishvananda/netlink: a sendto, a getsockname
// and a recvfrom into a fresh 64 KiB buffer each) is what bounded peer
// programming; here a window of requests goes in one sendmsg and their
// acks are read back, with every buffer reused.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlay-plugin/overlay-plugin/internal/lockrank"
)

const (
	// pipelineWindow is how many requests are in flight at once: their
	// acks must fit pipelineRcvBuf (an ack costs about a KiB of it).
	pipelineWindow = 256
	pipelineRcvBuf = 4 << 20
	// msgMax is the longest request: header, ndmsg, an IPv6 NDA_DST and
	// a padded NDA_LLADDR.
	msgMax = unix.NLMSG_HDRLEN + unix.SizeofNdMsg + 4 + 16 + 4 + 8
)

// pipeline is a sandbox's socket for Program. mu serialises its users
// (one per sandbox in the driver, but dumps and Watch share nothing
// with it).
type pipeline struct {
	// portid is the socket's netlink address: the events of the changes
	// it makes carry it (Watch).
	portid uint32
	// echoes are the FDB events Program's requests will cause.
	echoes echoes

	// mu guards s and seq: one window of requests and its acks at a time
	// on the socket. Above echoes.mu; nothing else is taken under it.
	mu  lockrank.Mutex[lockrank.Pipeline]
	s   *nl.NetlinkSocket
	seq uint32
	out []byte
	in  []byte
}

func newPipeline(ns netns.NsHandle) (*pipeline, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	fd := s.GetFd()
	tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
	err = errors.Join(
		// Acks without a copy of the request, and room for a window of them.
		unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1),
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, pipelineRcvBuf),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv))
	if err != nil {
		s.Close()
		return nil, err
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		s.Close()
		return nil, err
	}
	portid := sa.(*unix.SockaddrNetlink).Pid
	return &pipeline{portid: portid, s: s, out: make([]byte, 0, pipelineWindow*msgMax), in: make([]byte, 64<<10)}, nil
}

func (p *pipeline) close() { p.s.Close() }

// Program implements Kernel.
func (n *Netlink) Program(sandboxName string, ops []EntryOp) []error {
	if len(ops) == 0 {
		return nil
	}
	sb, idx, err := n.vxlan(sandboxName, false)
	if err != nil {
		errs := make([]error, len(ops))
		for i := range ops {
			errs[i] = fmt.Errorf("%s: %w", &ops[i], err)
		}
		return errs
	}
	defer n.release(sb)
	errs := sb.pipe.program(idx, ops)
	failed := false
	for i, err := range errs {
		switch {
		case err == nil:
		case isDeleteOp(ops[i].Kind) && errors.Is(err, unix.ENOENT):
			// The entry is not there: what the delete asked for (Kernel).
			errs[i] = nil
		default:
			failed = true
			sb.forget(idx, err)
			errs[i] = fmt.Errorf("%s in sandbox %q: %w", &ops[i], sandboxName, classify(err))
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// program sends ops a window at a time and collects their acks.
func (p *pipeline) program(idx int, ops []EntryOp) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(ops))
		}
		errs[i] = err
	}
	for start := 0; start < len(ops); start += pipelineWindow {
		win := ops[start:min(start+pipelineWindow, len(ops))]
		p.out = p.out[:0]
		// seq of request i is base+i; acks of an earlier window that
		// timed out are recognised by theirs and dropped.
		base := p.seq + 1
		p.seq += uint32(len(win))
		sent := 0
		// Recorded before they are sent: the echo may be read at once.
		p.echoes.mu.Lock()
		for i := range win {
			if err := p.encode(idx, &win[i], base+uint32(i)); err != nil {
				fail(start+i, err)
				continue
			}
			if isFDBOp(win[i].Kind) {
				p.echoes.expect(idx, &win[i])
			}
			sent++
		}
		p.echoes.mu.Unlock()
		if sent == 0 {
			continue
		}
		failWin := func(i int, err error) {
			fail(start+i, err)
			if isFDBOp(win[i].Kind) {
				p.echoes.forget(idx, &win[i])
			}
		}
		if err := p.exchange(base, win, sent, failWin); err != nil {
			for i := range win {
				if errs == nil || errs[start+i] == nil {
					failWin(i, err)
				}
			}
		}
	}
	return errs
}

// exchange sends p.out (sent requests numbered from base) and reads acks
// until every one is in, reporting the failed ones to fail. An error of
// the socket itself is returned: then any request of win may not have
// been applied.
func (p *pipeline) exchange(base uint32, win []EntryOp, sent int, fail func(int, error)) error {
	// An unconnected netlink socket writes to the kernel.
	if _, err := unix.Write(p.s.GetFd(), p.out); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	for sent > 0 {
		nr, err := unix.Read(p.s.GetFd(), p.in)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive acks: %w", err)
		}
		b := p.in[:nr]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := binary.NativeEndian.Uint32(b[0:4])
			if l < unix.NLMSG_HDRLEN || int(l) > len(b) {
				break
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			i := binary.NativeEndian.Uint32(b[8:12]) - base
			if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 && int(i) < len(win) && i < 1<<31 {
				sent--
				if code := int32(binary.NativeEndian.Uint32(b[16:20])); code != 0 {
					fail(int(i), unix.Errno(-code))
				}
			}
			b = b[min(nlmAlign(int(l)), len(b)):]
		}
	}
	return nil
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func nlmAlign(l int) int { return (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// encode appends op's request to p.out, as vishvananda/netlink's NeighSet,
// NeighAppend and NeighDel build it.
func (p *pipeline) encode(idx int, op *EntryOp, seq uint32) error {
	var (
		typ   uint16 = unix.RTM_NEWNEIGH
		flags uint16 = unix.NLM_F_REQUEST | unix.NLM_F_ACK
		fam   uint8
		state uint16
		ntf   uint8
		dst   netip.Addr
		mac   []byte
	)
	switch op.Kind {
	case OpSetNeighbor, OpDeleteNeighbor:
		dst = op.Neighbor.IP.Unmap()
		if !dst.IsValid() {
			return errors.New("invalid IP")
		}
		fam = uint8(family(dst))
		if op.Kind == OpSetNeighbor {
			flags |= unix.NLM_F_CREATE | unix.NLM_F_REPLACE
			state, mac = unix.NUD_PERMANENT, op.Neighbor.MAC[:]
		} else {
			typ = unix.RTM_DELNEIGH
		}
	case OpAddFDB, OpDeleteFDB:
		dst = op.FDB.VTEP.Unmap()
		if !dst.IsValid() || dst.IsUnspecified() {
			return fmt.Errorf("invalid VTEP %v", op.FDB.VTEP)
		}
		fam, ntf, state, mac = unix.AF_BRIDGE, unix.NTF_SELF, unix.NUD_PERMANENT, op.FDB.MAC[:]
		switch {
		case op.Kind == OpDeleteFDB:
			typ = unix.RTM_DELNEIGH
		case op.FDB.MAC.IsZero():
			// Appending a destination that is there already is a no-op.
			flags |= unix.NLM_F_CREATE | unix.NLM_F_APPEND
		default:
			flags |= unix.NLM_F_CREATE | unix.NLM_F_REPLACE
		}
	default:
		return fmt.Errorf("unknown entry op %d", op.Kind)
	}
	start := len(p.out)
	b := p.out[start : start+unix.NLMSG_HDRLEN+unix.SizeofNdMsg]
	clear(b)
	ne := binary.NativeEndian
	ne.PutUint16(b[4:6], typ)
	ne.PutUint16(b[6:8], flags)
	ne.PutUint32(b[8:12], seq)
	b[16] = fam
	ne.PutUint32(b[20:24], uint32(int32(idx)))
	ne.PutUint16(b[24:26], state)
	b[26] = ntf
	p.out = p.out[:start+len(b)]
	if dst.Is4() {
		a := dst.As4()
		p.attr(unix.NDA_DST, a[:])
	} else {
		a := dst.As16()
		p.attr(unix.NDA_DST, a[:])
	}
	if mac != nil {
		p.attr(unix.NDA_LLADDR, mac)
	}
	ne.PutUint32(p.out[start:start+4], uint32(len(p.out)-start))
	return nil
}

// attr appends a padded rtattr.
func (p *pipeline) attr(typ uint16, v []byte) {
	l := 4 + len(v)
	start := len(p.out)
	p.out = p.out[:start+nlmAlign(l)]
	binary.NativeEndian.PutUint16(p.out[start:], uint16(l))
	binary.NativeEndian.PutUint16(p.out[start+2:], typ)
	copy(p.out[start+4:], v)
	clear(p.out[start+l:])
}
