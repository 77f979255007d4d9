package payments

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// APIKeys maps secret API keys to the accounts they act as. The zero value
// knows no key.
type APIKeys struct {
	keys []apiKey
}

type apiKey struct {
	digest  [sha256.Size]byte // of the secret: every comparison is the same length
	account string
}

// minSecretLen is the shortest secret accepted: guessing one must be out
// of reach.
const minSecretLen = 16

// LoadAPIKeys reads the file at path: one "SECRET ACCOUNT" per line,
// separated by spaces or tabs; blank lines and lines starting with # are
// skipped. It refuses a file that its group or others may read or write:
// the secrets are credentials.
func LoadAPIKeys(path string) (*APIKeys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("api keys %s: mode %v lets others read or write it; chmod 600 it", path, perm)
	}
	k, err := ParseAPIKeys(f)
	if err != nil {
		return nil, fmt.Errorf("api keys %s: %w", path, err)
	}
	return k, nil
}

// ParseAPIKeys reads "SECRET ACCOUNT" lines (see LoadAPIKeys) from r.
func ParseAPIKeys(r io.Reader) (*APIKeys, error) {
	k := &APIKeys{}
	seen := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want SECRET ACCOUNT", n)
		}
		if len(f[0]) < minSecretLen {
			return nil, fmt.Errorf("line %d: the secret is %d bytes, want at least %d", n, len(f[0]), minSecretLen)
		}
		if err := validAccount(f[1]); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		d := sha256.Sum256([]byte(f[0]))
		if seen[d] {
			return nil, fmt.Errorf("line %d: a secret given twice", n)
		}
		seen[d] = true
		k.keys = append(k.keys, apiKey{digest: d, account: f[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(k.keys) == 0 {
		return nil, errors.New("no keys")
	}
	return k, nil
}

// Account returns the account secret acts as. It compares secret with
// every key in constant time, so its timing says nothing about which key,
// if any, is close.
func (k *APIKeys) Account(secret string) (string, bool) {
	d := sha256.Sum256([]byte(secret))
	account, found := "", 0
	for _, key := range k.keys {
		if subtle.ConstantTimeCompare(d[:], key.digest[:]) == 1 {
			account, found = key.account, 1
		}
	}
	return account, found == 1
}

// validAccount reports whether name can be an account: 1 to 64 bytes of
// letters, digits, '_', '-' and '.'. Every route applies the same rule,
// whether the account comes from an API key or, in demo mode, from the
// token itself.
func validAccount(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("the account %q must be 1 to 64 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("the account may hold only letters, digits, '_', '-' and '.'")
		}
	}
	return nil
}
