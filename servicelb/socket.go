package servicelb

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A batch goes to the kernel in one sendmsg, which the socket's send
// buffer must hold whole (else the send fails with EMSGSIZE). The kernel
// answers a batch with the acknowledgement of its last message and an
// error per message it refused (batch.go), but a bare flush of
// google/nftables asks for an acknowledgement of every message, which the
// receive buffer must hold until read: else the kernel drops some
// (ENOBUFS) of a batch it did commit. A backend takes about 500 bytes and
// 2.5 messages of a batch (a chain, its rule, a map element); an
// acknowledgement about 600 bytes of receive buffer. Room for twice that
// and more, per service or backend, and for small batches. Variables, so
// that a test can make acknowledgements overflow.
var (
	bufferBase    = 256 << 10
	sendPerEntry  = 2 << 10
	recvPerEntry  = 4 << 10
	socketBuffers = func(svcs []Service) (send, recv int) {
		n := 0
		for _, s := range svcs {
			n += 1 + len(s.Backends)
		}
		return bufferBase + n*sendPerEntry, bufferBase + n*recvPerEntry
	}
)

// withBuffers sizes the buffers of an nftables connection's socket, as
// sizeBuffers.
func withBuffers(send, recv int) nftables.ConnOption {
	return nftables.WithSockOptions(func(c *netlink.Conn) error { return sizeBuffers(c, send, recv) })
}

// sizeBuffers sizes a netlink socket's buffers (beyond the system's
// limits if the process has CAP_NET_ADMIN, as the plugin does; else up to
// them) and asks for acknowledgements without a copy of the request.
func sizeBuffers(c *netlink.Conn, send, recv int) error {
	if err := c.SetOption(netlink.CapAcknowledge, true); err != nil {
		return fmt.Errorf("cap acknowledgements: %w", err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, send),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, recv))
	}); err != nil {
		return err
	}
	if errors.Is(serr, unix.EPERM) {
		return errors.Join(c.SetWriteBuffer(send), c.SetReadBuffer(recv))
	}
	return serr
}
