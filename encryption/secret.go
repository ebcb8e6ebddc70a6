package encryption

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// ReadSecret reads the cluster secret: SecretLen random bytes in base64.
// The file should be readable by root only; a looser mode is reported, not
// refused, since a mounted secret's mode is not always ours to choose.
func ReadSecret(path string, log *slog.Logger) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster secret: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != SecretLen {
		return nil, fmt.Errorf("cluster secret %s: want %d random bytes in base64 (make one with: head -c32 /dev/urandom | base64)", path, SecretLen)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("secret file readable by others", "hint", "chmod 600 it", "path", path, "mode", fi.Mode().Perm())
	}
	return key, nil
}

// Uses of the cluster secret: each gets a key of its own (Subkey), so the
// gossip key and the IPsec salt never coincide.
const (
	UseGossip = "gossip v1"
	UseESP    = "esp salt v1"
)

// Subkey derives the independent key of one use of the cluster secret.
func Subkey(secret []byte, use string) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, "overlay-plugin "+use, 32)
	if err != nil {
		panic(err) // only for impossible lengths
	}
	return k
}
