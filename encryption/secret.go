package encryption

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// MaxSecrets bounds the keyring: a rotation holds two or three at a time.
const MaxSecrets = 8

// secretHint is how to make a secret, for the errors that ask for one.
const secretHint = "make one with: head -c32 /dev/urandom | base64"

// Secret is one cluster secret of the keyring.
type Secret struct {
	// ID names the secret without revealing it (SecretID): logs, the
	// gossip and `overlay-plugin cluster` show it.
	ID  string
	Key []byte
}

// LoadSecrets parses data, the contents of the cluster's keyring file at
// path: one secret per line, each SecretLen random bytes in base64, the
// first the primary. What the operator should fix but that is no error is
// logged: a repeated secret, and a mode looser than root's alone (not
// refused, since a mounted secret's mode is not always ours to choose).
func LoadSecrets(path string, data []byte, log *slog.Logger) ([]Secret, error) {
	secrets, dups, err := ParseSecrets(data)
	if err != nil {
		return nil, fmt.Errorf("cluster secret %s: %w", path, err)
	}
	for _, d := range dups {
		log.Warn("secret file repeats a secret", "why", "the repeat is ignored", "path", path, "line", d.line, "id", d.id)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("secret file readable by others", "hint", "chmod 600 it", "path", path, "mode", fi.Mode().Perm())
	}
	return secrets, nil
}

// Duplicate is a line that repeats an earlier line's secret.
type Duplicate struct {
	line int
	id   string
}

// ParseSecrets parses a keyring file: blank lines and lines starting with
// # are skipped, a line that repeats an earlier secret is ignored (and
// reported), and a line that is not a secret fails the whole file, so that
// a half-edited file never replaces a working keyring.
func ParseSecrets(data []byte) ([]Secret, []Duplicate, error) {
	var out []Secret
	var dups []Duplicate
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(key) != SecretLen {
			return nil, nil, fmt.Errorf("line %d: want %d random bytes in base64 (%s)", i+1, SecretLen, secretHint)
		}
		s := Secret{ID: SecretID(key), Key: key}
		if indexOf(out, key) >= 0 {
			dups = append(dups, Duplicate{line: i + 1, id: s.ID})
			continue
		}
		out = append(out, s)
	}
	switch {
	case len(out) == 0:
		return nil, nil, fmt.Errorf("no secret (%s)", secretHint)
	case len(out) > MaxSecrets:
		return nil, nil, fmt.Errorf("%d secrets, at most %d", len(out), MaxSecrets)
	}
	return out, dups, nil
}

func indexOf(ring []Secret, key []byte) int {
	for i, s := range ring {
		if bytes.Equal(s.Key, key) {
			return i
		}
	}
	return -1
}

// IDs lists the secrets' ids, in order.
func IDs(ring []Secret) []string {
	out := make([]string, len(ring))
	for i, s := range ring {
		out[i] = s.ID
	}
	return out
}

// SecretID is the id of a secret: 8 hex digits of a key derived from it
// for this use alone, so it tells nothing of the secret or its other keys.
func SecretID(secret []byte) string {
	return hex.EncodeToString(Subkey(secret, useID)[:4])
}

// Uses of the cluster secret: each gets a key of its own (Subkey), so the
// gossip key and the IPsec salt never coincide.
const (
	UseGossip = "gossip v1"
	UseESP    = "esp salt v1"
	useID     = "key id v1"
)

// Subkey derives the independent key of one use of the cluster secret.
func Subkey(secret []byte, use string) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, "overlay-plugin "+use, 32)
	if err != nil {
		panic(err) // only for impossible lengths
	}
	return k
}
