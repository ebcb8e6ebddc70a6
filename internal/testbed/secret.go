package testbed

import (
	"crypto/rand"
	"encoding/base64"
	"os"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// WriteSecret writes a fresh cluster secret for --secret-file, a
// SecretLine and a newline, readable by the owner only (the plugin warns
// otherwise).
func WriteSecret(path string) error {
	return os.WriteFile(path, []byte(SecretLine()+"\n"), 0o600)
}

// SecretLine is a fresh cluster secret as a line of the secret file:
// random bytes in base64, as `head -c32 /dev/urandom | base64` makes them.
func SecretLine() string {
	key := make([]byte, encryption.SecretLen)
	_, _ = rand.Read(key)
	return base64.StdEncoding.EncodeToString(key)
}
