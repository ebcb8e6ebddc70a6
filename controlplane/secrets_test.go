package controlplane

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/overlay-plugin/overlay-plugin/driver"
	"github.com/overlay-plugin/overlay-plugin/encryption"
)

func secretLine(b byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, encryption.SecretLen)) + "\n"
}

func secretID(b byte) string {
	return encryption.SecretID(bytes.Repeat([]byte{b}, encryption.SecretLen))
}

// TestSecretFileReload: a changed keyring is applied, in its order; a file
// that cannot be used (bad line, empty, gone, refused by apply) changes
// nothing and is reported, once a reading; a file changed only in form is
// no change; Reload reads at once and says how it went.
func TestSecretFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(secretLine(1))
	var logs bytes.Buffer
	f, err := newSecretFile(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var applied [][]string
	var refuse error
	apply := func(ring []encryption.Secret) error {
		if refuse != nil {
			return refuse
		}
		applied = append(applied, encryption.IDs(ring))
		return nil
	}
	held := func() []string { return encryption.IDs(f.held()) }

	write(secretLine(1) + secretLine(2))
	if err := f.check(apply, false); err != nil || !slices.Equal(held(), []string{secretID(1), secretID(2)}) || len(applied) != 1 {
		t.Fatalf("new line: err %v, held %v, applied %v", err, held(), applied)
	}
	write("# rotation\n\n" + secretLine(1) + "  " + secretLine(2))
	if err := f.check(apply, false); err != nil || len(applied) != 1 {
		t.Fatalf("comments and spaces only: err %v, applied %v", err, applied)
	}
	for name, bad := range map[string]string{"a bad line": secretLine(2) + "nope\n", "empty": "\n"} {
		write(bad)
		err := f.check(apply, false)
		if err == nil || !strings.Contains(err.Error(), "stay in use") || len(applied) != 1 || !slices.Equal(held(), []string{secretID(1), secretID(2)}) {
			t.Fatalf("%s: err %v, applied %v, held %v", name, err, applied, held())
		}
		if f.now.Load().err == nil {
			t.Fatalf("%s: the error is not kept for the operator", name)
		}
	}
	logs.Reset()
	if err := f.check(apply, false); err == nil { // read again, not logged again
		t.Fatal("an unchanged bad file passed")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	f.check(apply, false)
	f.check(apply, false)
	if n := strings.Count(logs.String(), "secret file refused"); n != 1 {
		t.Fatalf("an unchanged bad file then a missing one logged %d times in three readings, want once (the change):\n%s", n, logs.String())
	}
	write(secretLine(2) + secretLine(1))
	refuse = errors.New("the kernel said no")
	if err := f.check(apply, false); err == nil || !slices.Equal(held(), []string{secretID(1), secretID(2)}) {
		t.Fatalf("refused by apply: err %v, held %v", err, held())
	}
	refuse = nil
	if err := f.check(apply, false); err != nil || !slices.Equal(held(), []string{secretID(2), secretID(1)}) || f.now.Load().err != nil {
		t.Fatalf("the next reading after the refusal: err %v, held %v", err, held())
	}

	// Reload through the running loop.
	p := &Plane{secrets: f}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.run(ctx, apply) }()
	write(secretLine(2))
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := p.Reload(rctx); err != nil || !slices.Equal(held(), []string{secretID(2)}) {
		t.Fatalf("reload: err %v, held %v", err, held())
	}
	write("garbage\n")
	if err := p.Reload(rctx); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("reload of a bad file: %v", err)
	}
	cancel()
	<-done
	if err := p.Reload(rctx); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("reload once the loop stopped: %v", err)
	}
	if err := (&Plane{}).Reload(rctx); !errors.Is(err, errNoSecretFile) {
		t.Fatalf("reload without a secret file: %v", err)
	}
}

// TestSecretFilePolled: the loop notices a changed file within secretsPoll.
func TestSecretFilePolled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(secretLine(1)), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := newSecretFile(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.run(ctx, func(ring []encryption.Secret) error { got <- encryption.IDs(ring); return nil })
	if err := os.WriteFile(path, []byte(secretLine(1)+secretLine(3)), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-got:
		if !slices.Equal(ids, []string{secretID(1), secretID(3)}) {
			t.Fatalf("applied %v", ids)
		}
	case <-time.After(3 * secretsPoll):
		t.Fatalf("a changed file not applied within %v", 3*secretsPoll)
	}
}
