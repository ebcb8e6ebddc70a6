package lockrank

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The graph in the package documentation is the order the code takes:
// its table lists every class, in rank order, and nothing else.
func TestDocumentedGraphIsTheOrder(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`^//\t(\d+)\s+(\w+)\s`)
	var got []string
	for _, l := range strings.Split(string(src), "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n != len(got)+1 {
			t.Errorf("doc.go: row %q has rank %s, want %d", l, m[1], len(got)+1)
		}
		got = append(got, m[2])
	}
	var want []string
	for i, c := range Classes {
		if int(c.Rank()) != i+1 {
			t.Errorf("Classes[%d] = %s has rank %d", i, Name(c), c.Rank())
		}
		want = append(want, Name(c))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("doc.go's graph lists\n  %v\nthe code's order is\n  %v", got, want)
	}
}

func TestHeldRefusesWhatRanksAbove(t *testing.T) {
	var h held
	net, drv := Network{}.Rank(), Driver{}.Rank()
	if err := h.acquire(1, net); err != nil {
		t.Fatal(err)
	}
	if err := h.acquire(1, drv); err != nil {
		t.Fatalf("Driver under Network: %v", err)
	}
	if err := h.acquire(2, net); err != nil {
		t.Fatalf("another goroutine is independent: %v", err)
	}
	h.release(1, drv)
	if err := h.acquire(1, net); err == nil || !strings.Contains(err.Error(), "takes Network (rank 1) while holding Network") {
		t.Fatalf("a second Network lock under the first: %v, want a violation", err)
	}
	h.release(1, net)
	if err := h.acquire(1, drv); err != nil {
		t.Fatal(err)
	}
	if err := h.acquire(1, net); err == nil || !strings.Contains(err.Error(), "while holding Driver") {
		t.Fatalf("Network under Driver: %v, want a violation", err)
	}
	h.release(1, drv)
	h.release(2, net)
	if len(h.by) != 0 {
		t.Fatalf("held after every release: %v", h.by)
	}
}

// Every mutex of the plugin's own code has a rank: a plain sync.Mutex
// would sit outside the checked order. Test doubles and test harnesses,
// whose locks no production path takes, are exempt.
func TestEveryMutexHasARank(t *testing.T) {
	exempt := []string{"bench/", "internal/testbed/", "internal/testns/", "internal/demo/", "internal/faults/",
		"internal/lockrank/", "kernel/fakekernel/", "encryption/fakexfrm/", "servicelb/fakelb/", "cluster/memnet/", "test/",
		"firewall/firewalltest/", "dockerengine/enginetest/"}
	plain := regexp.MustCompile(`sync\.(RW)?Mutex\b`)
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			if strings.HasPrefix(e.Name(), ".") && rel != "." || slices.Contains(exempt, rel+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, l := range strings.Split(string(src), "\n") {
			if plain.MatchString(l) && !strings.HasPrefix(strings.TrimSpace(l), "//") {
				t.Errorf("%s:%d: a mutex without a rank (make it a lockrank.Mutex and add it to doc.go): %s", rel, i+1, strings.TrimSpace(l))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
