// Package pluginapitest is a test client of Docker's plugin protocol: POST
// a call, check the answer.
package pluginapitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/overlay-plugin/overlay-plugin/pluginapi"
)

// Reply is an HTTP answer.
type Reply struct {
	Status      int
	ContentType string
	Body        []byte
}

// Post calls path with body: nil, a string or []byte sent as is, or
// anything else as JSON.
func Post(t *testing.T, c *http.Client, base, path string, body any) Reply {
	t.Helper()
	r, err := TryPost(c, base, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TryPost is Post for goroutines other than the test's.
func TryPost(c *http.Client, base, path string, body any) (Reply, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return Reply{}, err
		}
		rd = bytes.NewReader(data)
	}
	resp, err := c.Post(base+path, "application/json", rd)
	if err != nil {
		return Reply{}, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, fmt.Errorf("POST %s: %w", path, err)
	}
	return Reply{resp.StatusCode, resp.Header.Get("Content-Type"), data}, nil
}

// OK decodes a successful answer into out (unless nil).
func (r Reply) OK(t *testing.T, what string, out any) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s", what, r.Status, r.Body)
	}
	if out == nil {
		return
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		t.Fatalf("%s: decode %s: %v", what, r.Body, err)
	}
}

// ErrMsg checks that r is an error answer {"Err": "..."} and returns the
// message.
func (r Reply) ErrMsg(t *testing.T, what string) string {
	t.Helper()
	if r.Status < 400 {
		t.Fatalf("%s: HTTP %d %s, want an error", what, r.Status, r.Body)
	}
	if r.ContentType != pluginapi.ContentType {
		t.Errorf("%s: Content-Type %q, want %q", what, r.ContentType, pluginapi.ContentType)
	}
	var e struct{ Err string }
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Err == "" {
		t.Fatalf("%s: body %q is not {\"Err\": \"...\"}: %v", what, r.Body, err)
	}
	return e.Err
}
