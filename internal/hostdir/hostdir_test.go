package hostdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The managed plugin's layout: a link whose target's parent exists but
// whose target does not, the state of a fresh host.
func TestMakeFollowsDanglingLink(t *testing.T) {
	root := t.TempDir()
	host := filepath.Join(root, "host", "run")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "run", "overlay-plugin")
	if err := os.Symlink(filepath.Join(host, "overlay-plugin"), link); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(link, "netns"), 0o755); err == nil {
		t.Fatal("os.MkdirAll went through the dangling link: this test no longer shows why Make exists")
	}
	got, err := Make(filepath.Join(link, "netns"), 0o755)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(host, "overlay-plugin", "netns")
	if real, _ := filepath.EvalSymlinks(want); got != want || real != want {
		t.Fatalf("Make = %q, want %q (created: %q)", got, want, real)
	}
	// Again: everything exists now.
	if got2, err := Make(filepath.Join(link, "netns"), 0o755); err != nil || got2 != want {
		t.Fatalf("second Make = %q, %v", got2, err)
	}
}

func TestMakeRelativeLinkAndErrors(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("target/sub", filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	got, err := Make(filepath.Join(root, "rel", "x"), 0o700)
	if err != nil || got != filepath.Join(root, "target", "sub", "x") {
		t.Fatalf("relative link: %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Make(filepath.Join(root, "file", "x"), 0o700); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("through a file: %v", err)
	}
	if err := os.Symlink("loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	if _, err := Make(filepath.Join(root, "loop", "x"), 0o700); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Fatalf("loop: %v", err)
	}
}
