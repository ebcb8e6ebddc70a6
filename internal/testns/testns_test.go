package testns_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/overlay-plugin/overlay-plugin/internal/nsthread"
	"github.com/overlay-plugin/overlay-plugin/internal/testns"
)

func current(t *testing.T) string {
	t.Helper()
	h, err := nsthread.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.UniqueId()
}

func TestNewAndDo(t *testing.T) {
	ns := testns.New(t)
	start := current(t)
	if ns.UniqueId() == start {
		t.Fatalf("New returned the current namespace")
	}
	var inside string
	if err := testns.Do(ns, func() error {
		h, err := netns.Get()
		if err != nil {
			return err
		}
		defer h.Close()
		inside = h.UniqueId()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside != ns.UniqueId() {
		t.Errorf("Do ran in %s, want %s", inside, ns.UniqueId())
	}
	if got := current(t); got != start {
		t.Errorf("namespace of the test goroutine changed: %s -> %s", start, got)
	}
	sentinel := errors.New("from f")
	if err := testns.Do(ns, func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Errorf("Do returned %v, want f's error", err)
	}
	if other := testns.New(t); other.UniqueId() == ns.UniqueId() {
		t.Errorf("two New calls returned the same namespace")
	}
}

func TestPublish(t *testing.T) {
	ns := testns.New(t)
	var path string
	t.Run("published", func(t *testing.T) {
		path = testns.Publish(t, ns, "slbtestns")
		h, err := netns.GetFromPath(path)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if !h.Equal(ns) {
			t.Errorf("%s is %s, want %s", path, h.UniqueId(), ns.UniqueId())
		}
	})
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after cleanup, stat %s: %v (want not exist)", filepath.Dir(path), err)
	}
}
