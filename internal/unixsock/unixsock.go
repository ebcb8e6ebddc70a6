// Package unixsock listens on unix sockets the way a plugin must: only one
// live server per path, a stale file replaced, and the socket visible at
// its path only with its final mode.
package unixsock

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"
)

// maxPath is the longest path a unix socket address holds (sun_path
// is 108 bytes with the terminating NUL), less what listenPrivately adds
// to bind it first in a private directory beside it (privateDir:
// ".s", up to 10 digits, "/s").
const maxPath = 107 - 14

// privateDir is the pattern of listenPrivately's directory.
const privateDir = ".s"

// CheckPath refuses a path too long for Listen.
func CheckPath(p string) error {
	if len(p) > maxPath {
		return fmt.Errorf("socket path %q is %d bytes; at most %d here (unix sockets hold 107, and the socket is bound in a private directory beside it first)", p, len(p), maxPath)
	}
	return nil
}

// Listen listens on a unix socket at path, creating its directory with
// dirMode and giving the socket mode. A socket file nobody serves is
// removed first; a live one (another instance) is an error, as is a file
// that is not a socket.
func Listen(path string, dirMode, mode os.FileMode) (net.Listener, error) {
	if err := CheckPath(path); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; not removing it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use: another process (another overlay-plugin instance?) serves on it", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	return listenPrivately(path, mode)
}

// listenPrivately binds the socket in a new 0700 directory beside path,
// gives it mode, then renames it into place: a socket bound at path
// itself exists with the process umask's mode until a chmod, and a client
// that connects in that window (umask 000) keeps its connection.
func listenPrivately(path string, mode os.FileMode) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), privateDir)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // it would unlink tmp, not path
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		return nil, err
	}
	return movedListener{ul, path}, nil
}

// movedListener removes its socket file when closed, as a unix listener
// bound at the path would: new connections are refused from then on.
type movedListener struct {
	*net.UnixListener
	path string
}

func (l movedListener) Close() error {
	err := l.UnixListener.Close()
	if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}

// Remove removes a socket file of ours. Closing its listener usually has
// removed it already.
func Remove(log *slog.Logger, path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("remove socket", "path", path, "err", err)
	}
}
