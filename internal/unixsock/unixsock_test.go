package unixsock

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A socket appears at its path only with its final mode, whatever the
// umask. Bound at the path itself it existed with the umask's mode (0777
// under umask 000) until a chmod, and a client that connected in that
// window kept its connection to the admin API.
func TestListenHasNoWindow(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	seenAny := 0
	for i := range 300 {
		path := filepath.Join(dir, fmt.Sprintf("s%d.sock", i))
		stop, seen := make(chan struct{}), make(chan os.FileMode, 1)
		go func() {
			for {
				select {
				case <-stop:
					close(seen)
					return
				default:
				}
				if fi, err := os.Lstat(path); err == nil {
					seen <- fi.Mode().Perm()
					close(seen)
					return
				}
			}
		}()
		l, err := Listen(path, 0o700, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		close(stop)
		if m, ok := <-seen; ok {
			seenAny++
			if m != 0o600 {
				t.Fatalf("socket %d was visible with mode %o before its final 0600", i, m)
			}
		}
		l.Close()
	}
	if left, _ := filepath.Glob(filepath.Join(dir, privateDir+"*")); len(left) > 0 {
		t.Errorf("private directories left behind: %v", left)
	}
	t.Logf("the observer saw %d of 300 sockets appear, each with its final mode", seenAny)
}
