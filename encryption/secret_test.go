package encryption

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testSecret(b byte) []byte { return bytes.Repeat([]byte{b}, SecretLen) }

func line(b byte) string { return base64.StdEncoding.EncodeToString(testSecret(b)) }

func TestParseSecrets(t *testing.T) {
	many := ""
	for i := range MaxSecrets + 1 {
		many += line(byte(i+1)) + "\n"
	}
	for name, tc := range map[string]struct {
		file string
		want []byte // first byte of each secret, in order
		dups int
		err  string
	}{
		"one, as 0.1.0 reads it": {file: line(1) + "\n", want: []byte{1}},
		"no newline":             {file: line(1), want: []byte{1}},
		"blank lines, comments, spaces and CRLF": {
			file: "\n# the new one\n  " + line(2) + "  \r\n\n" + line(1) + "\n\n", want: []byte{2, 1}},
		"a repeat is ignored":  {file: line(1) + "\n" + line(2) + "\n" + line(1) + "\n", want: []byte{1, 2}, dups: 1},
		"empty":                {file: "", err: "no secret"},
		"only comments":        {file: "# none yet\n\n", err: "no secret"},
		"not base64":           {file: line(1) + "\nnot a secret!\n", err: "line 2: want 32 random bytes"},
		"wrong length":         {file: base64.StdEncoding.EncodeToString(make([]byte, 16)), err: "line 1: want 32 random bytes"},
		"more than MaxSecrets": {file: many, err: fmt.Sprintf("%d secrets, at most %d", MaxSecrets+1, MaxSecrets)},
		"MaxSecrets":           {file: strings.Join(strings.Split(many, "\n")[:MaxSecrets], "\n"), want: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
	} {
		t.Run(name, func(t *testing.T) {
			ring, dups, err := ParseSecrets([]byte(tc.file))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if ring != nil {
					t.Fatal("a keyring returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			for _, s := range ring {
				got = append(got, s.Key[0])
				if s.ID != SecretID(s.Key) {
					t.Fatalf("secret %d has id %s", s.Key[0], s.ID)
				}
			}
			if !bytes.Equal(got, tc.want) || len(dups) != tc.dups {
				t.Fatalf("secrets %v (%d repeats), want %v (%d)", got, len(dups), tc.want, tc.dups)
			}
		})
	}
}

// TestSecretID: 8 hex digits, stable, different per secret, and not a
// piece of the secret or of its keys.
func TestSecretID(t *testing.T) {
	a, b := SecretID(testSecret(1)), SecretID(testSecret(2))
	if len(a) != 8 || a == b || a != SecretID(testSecret(1)) {
		t.Fatalf("ids %s, %s", a, b)
	}
	for _, k := range [][]byte{testSecret(1), Subkey(testSecret(1), UseGossip), Subkey(testSecret(1), UseESP)} {
		if strings.Contains(fmt.Sprintf("%x", k), a) {
			t.Fatalf("id %s is part of a key", a)
		}
	}
}

func TestLoadSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(line(2)+"\n"+line(1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ring, err := LoadSecrets(path, []byte(line(2)+"\n"+line(1)+"\n"+line(2)+"\n"), log)
	if err != nil || !slices.Equal(IDs(ring), []string{SecretID(testSecret(2)), SecretID(testSecret(1))}) {
		t.Fatalf("ring %v, err %v", IDs(ring), err)
	}
	if !strings.Contains(logs.String(), "repeats a secret") || strings.Contains(logs.String(), "readable by others") {
		t.Fatalf("a repeat and a 0600 file logged as:\n%s", logs.String())
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	if _, err := LoadSecrets(path, []byte(line(1)), log); err != nil || !strings.Contains(logs.String(), "readable by others") {
		t.Fatalf("a 0644 file: err %v, logged:\n%s", err, logs.String())
	}
	if _, err := LoadSecrets(path, []byte("\n"), log); err == nil || !strings.Contains(err.Error(), path+": no secret") {
		t.Fatalf("empty file: %v", err)
	}
}
