package encryption

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// masked returns the key XOR 0xFF, so the test itself never holds a copy of
// the key it looks for.
func masked(k []byte) []byte {
	out := make([]byte, len(k))
	for i := range k {
		out[i] = k[i] ^ 0xFF
	}
	return out
}

// countInMemory counts occurrences of the unmasked pattern in the process's
// writable memory, comparing byte by byte so the pattern is never built.
func countInMemory(t *testing.T, m []byte) int {
	t.Helper()
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("cannot read /proc/self/maps: %v", err)
	}
	defer maps.Close()
	mem, err := os.Open("/proc/self/mem")
	if err != nil {
		t.Skipf("cannot read /proc/self/mem: %v", err)
	}
	defer mem.Close()
	found := 0
	buf := make([]byte, 1<<20)
	defer clear(buf) // what it read holds the key while it is live
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[1], "rw") {
			continue
		}
		var lo, hi uint64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); err != nil {
			continue
		}
		for off := lo; off < hi; off += uint64(len(buf)) - 31 {
			n := min(uint64(len(buf)), hi-off)
			got, _ := mem.ReadAt(buf[:n], int64(off))
			first := m[0] ^ 0xFF
		scan:
			for i := 0; i+len(m) <= got; i++ {
				k := bytes.IndexByte(buf[i:got-len(m)+1], first)
				if k < 0 {
					break
				}
				i += k
				for j := range m {
					if buf[i+j] != m[j]^0xFF {
						continue scan
					}
				}
				found++
			}
			if n < uint64(len(buf)) {
				break
			}
		}
	}
	return found
}

func TestRetiredKeyLeavesNoCopyInMemory(t *testing.T) {
	if !ErasesTemporaries {
		if strings.Contains(os.Getenv("GOEXPERIMENT"), "runtimesecret") {
			t.Fatal("GOEXPERIMENT=runtimesecret is set, yet the test was built without it")
		}
		// Plain `go test ./...` has no experiment; the Makefile sets it.
		t.Skip("built without GOEXPERIMENT=runtimesecret, so key computations leave copies behind and there is nothing to check: `make test-go` (part of `make test`) runs this test with it")
	}
	s := testSchedule()
	k, err := NewKeyring(s, t0)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := NewKeyring(s, t0)
	if err != nil {
		t.Fatal(err)
	}
	first := k.gens[0]
	m := masked(first.priv)
	// Use the key the way the manager does, often enough that the
	// runtime preempts the computation now and then.
	for range 10 {
		if _, err := k.Shared(first.pub.Gen, peer.Public()[0].Key); err != nil {
			t.Fatal(err)
		}
	}
	if n := countInMemory(t, m); n == 0 {
		t.Fatal("scanner does not find the live key: the test would prove nothing")
	}
	if err := k.ForceRotate(t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Tick(t0.Add(time.Second + s.Lead + s.Grace)); err != nil {
		t.Fatal(err)
	}
	if len(k.Public()) != 1 {
		t.Fatal("first generation not retired")
	}
	runtime.GC()
	if n := countInMemory(t, m); n != 0 {
		t.Fatalf("retired private key still in memory %d time(s)", n)
	}
}
