package lockrank

import (
	"os"
	"regexp"
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
