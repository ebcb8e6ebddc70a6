package testbed

import (
	"crypto/rand"
	"encoding/base64"
	"os"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// WriteSecret writes a fresh cluster secret for --secret-file: random
// bytes in base64 and a newline, as `head -c32 /dev/urandom | base64`
// writes them, readable by the owner only (the plugin warns otherwise).
func WriteSecret(path string) error {
	key := make([]byte, encryption.SecretLen)
	_, _ = rand.Read(key)
	return os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}
