package kernel

// The watch socket's reads: a burst of peer programming notifies every
// watch of every entry, and reading them one recvmsg (after a peek for
// the size) and two allocations each took more CPU than programming them.

import (
	"encoding/binary"
	"iter"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// batchReadMsgs datagrams are read per recvmmsg; a rtnetlink
	// notification is one datagram of one message.
	batchReadMsgs = 64
	// batchReadSlot bounds a datagram: a link message (the largest we
	// get, with its statistics and settings) is 1-2 KiB. A longer one is
	// truncated and reported as lost.
	batchReadSlot = 8 << 10
)

type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// batchReader reads datagrams from a netlink socket into buffers it
// reuses.
type batchReader struct {
	rc   syscall.RawConn
	buf  []byte
	iovs []unix.Iovec
	hdrs []mmsghdr
}

func newBatchReader(rc syscall.RawConn) *batchReader {
	r := &batchReader{rc: rc, buf: make([]byte, batchReadMsgs*batchReadSlot),
		iovs: make([]unix.Iovec, batchReadMsgs), hdrs: make([]mmsghdr, batchReadMsgs)}
	for i := range r.hdrs {
		r.iovs[i].Base = &r.buf[i*batchReadSlot]
		r.iovs[i].SetLen(batchReadSlot)
		r.hdrs[i].hdr.Iov = &r.iovs[i]
		r.hdrs[i].hdr.SetIovlen(1)
	}
	return r
}

// read waits for datagrams and calls f with each of what one recvmmsg
// returned (truncated: it did not fit its slot). The slices are valid
// only until f returns.
func (r *batchReader) read(f func(dgram []byte, truncated bool)) error {
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		m, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])),
			uintptr(len(r.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		n, errno = int(m), e
		return errno != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	for i := range n {
		h := &r.hdrs[i]
		l := min(int(h.n), batchReadSlot)
		f(r.buf[i*batchReadSlot:i*batchReadSlot+l], h.hdr.Flags&unix.MSG_TRUNC != 0)
	}
	return nil
}

// dropPortID makes the socket's kernel side discard the messages whose
// sender is portid (nlmsg_pid): the echoes of our own requests, which
// then cost the watch nothing.
func dropPortID(rc syscall.RawConn, portid uint32) error {
	// Classic BPF loads words big-endian; the header is in host order.
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], portid)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 12}, // nlmsg_pid
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: binary.BigEndian.Uint32(b[:])},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
	}); err != nil {
		return err
	}
	return serr
}

// nlMsg is one netlink message of a datagram: its type and payload.
type nlMsg struct {
	typ  uint16
	data []byte
}

// messages yields the messages of a datagram, up to the first malformed
// header.
func messages(dgram []byte) iter.Seq[nlMsg] {
	return func(yield func(nlMsg) bool) {
		b := dgram
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return
			}
			if !yield(nlMsg{typ: binary.NativeEndian.Uint16(b[4:6]), data: b[unix.NLMSG_HDRLEN:l]}) {
				return
			}
			b = b[min(nlmAlign(l), len(b)):]
		}
	}
}
