package faults_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/internal/faults"
)

func TestInjector(t *testing.T) {
	var in faults.Injector[string]
	if err := in.Check("a", "x"); err != nil || in.Calls("a") != 1 {
		t.Fatalf("without a hook: %v, %d calls", err, in.Calls("a"))
	}
	boom := errors.New("boom")
	in.Set(func(op, target string) error {
		if op == "a" && target == "x" {
			return boom
		}
		return nil
	})
	if err := in.Check("a", "x"); !errors.Is(err, boom) {
		t.Errorf("hooked call: %v", err)
	}
	if err := in.Check("a", "y"); err != nil {
		t.Errorf("other target: %v", err)
	}
	if got := in.Calls("a"); got != 2 {
		t.Errorf("Calls = %d, want 2 (the failed call is not counted)", got)
	}
	in.Set(nil)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_ = in.Check("b", "")
				in.Set(nil)
			}
		}()
	}
	wg.Wait()
	if got := in.Calls("b"); got != 400 {
		t.Errorf("Calls = %d, want 400", got)
	}
}
