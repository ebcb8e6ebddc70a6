// Package hostdir creates the plugin's directories on the host. In the
// managed plugin's rootfs, /run/overlay-plugin and /var/lib/overlay-plugin
// are symbolic links into mounts of the host's /run and /var/lib (parents
// that exist from boot, so the plugin enables on a fresh engine), and
// their targets may not exist yet: os.MkdirAll stops at such a dangling
// link, Make follows it.
package hostdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxLinks bounds the links followed, as the kernel's ELOOP does.
const maxLinks = 40

// Make creates the directory path and any missing parents with perm,
// following symbolic links (dangling ones included) to create their
// targets, and returns path with every link resolved.
func Make(path string, perm os.FileMode) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rest := strings.Split(strings.TrimPrefix(abs, "/"), "/")
	resolved := "/"
	for links := 0; len(rest) > 0; {
		next := filepath.Join(resolved, rest[0])
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(next, perm); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > maxLinks {
				return "", fmt.Errorf("%s: too many levels of symbolic links", path)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", err
			}
			if filepath.IsAbs(target) {
				resolved = "/"
			}
			// The link's target replaces its name; the rest follows it.
			rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest[1:]...)
			continue
		case !fi.IsDir():
			return "", fmt.Errorf("%s: not a directory", next)
		}
		resolved, rest = next, rest[1:]
	}
	return resolved, nil
}
