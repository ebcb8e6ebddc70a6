package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/driver"
)

// fakeInspector is a backend with a control plane whose reload answers
// err.
type fakeInspector struct {
	fakeBackend
	reloads int
	err     error
}

func (f *fakeInspector) Cluster() (any, error)    { return struct{}{}, nil }
func (f *fakeInspector) Encryption() (any, error) { return struct{}{}, nil }
func (f *fakeInspector) RotateKeys() error        { return nil }
func (f *fakeInspector) Check() (any, error)      { return struct{}{}, nil }
func (f *fakeInspector) ReloadSecrets(context.Context) error {
	f.reloads++
	return f.err
}

func TestReloadSecrets(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{
		{nil, http.StatusNoContent},
		{fmt.Errorf("%w: secret file refused: line 2: want 32 random bytes", driver.ErrInvalid), http.StatusBadRequest},
		{fmt.Errorf("%w: no cluster secret", driver.ErrNotFound), http.StatusNotFound},
		{errors.New("something else"), http.StatusInternalServerError},
	} {
		in := &fakeInspector{err: c.err}
		r := do(t, NewServer(in, nil, nil), http.MethodPost, "/v1/secrets/reload", "")
		if r.status != c.status || in.reloads != 1 {
			t.Errorf("reload answering %v: status %d after %d calls, want %d", c.err, r.status, in.reloads, c.status)
		}
		if c.err != nil && errorOf(t, r) != c.err.Error() {
			t.Errorf("the error is not passed on: %q", errorOf(t, r))
		}
	}
	in := &fakeInspector{}
	if r := do(t, NewServer(in, nil, nil), http.MethodGet, "/v1/secrets/reload", ""); r.status != http.StatusMethodNotAllowed || in.reloads != 0 {
		t.Errorf("GET: status %d, %d reloads", r.status, in.reloads)
	}
	if r := do(t, NewServer(in, func() bool { return false }, nil), http.MethodPost, "/v1/secrets/reload", ""); r.status != http.StatusServiceUnavailable || in.reloads != 0 {
		t.Errorf("not ready: status %d, %d reloads", r.status, in.reloads)
	}
}
