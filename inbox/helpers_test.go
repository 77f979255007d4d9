package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/ttl"
)

// The consumer's suite runs on both stores in internal/layertest/inbox.
// What follows is a copy of its helpers for the tests that stay here (the
// JetStream driver's and the logs'), which run on the engine only: the
// library's tests need no PostgreSQL driver.

// TestMain runs the tests, then looks for leaked goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var ctx = context.Background()

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// markWindow is the retention of the tests' dedup marks (class "inbox").
const markWindow = 7 * 24 * time.Hour

// env is the engine in a temporary directory, on a fake clock, with the
// retention class "inbox" (and the settings internal/layertest/teststore
// gives it).
type env struct {
	t     *testing.T
	dir   string
	clock *fakeclock.Clock
	e     *engine.Engine
}

func newEnv(t *testing.T) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

func (v *env) open() {
	e, err := engine.Open(v.dir, &engine.Options{Clock: v.clock, RetentionClasses: ttl.Classes{"inbox": markWindow},
		NoBackgroundSweep: true, CacheSize: 8 << 20, MemTableSize: 4 << 20})
	require.NoError(v.t, err)
	v.e = e
}

// reopen closes the store and opens it again, as a restart does.
func (v *env) reopen() {
	require.NoError(v.t, v.e.Close())
	v.open()
}

func (v *env) consumer() *inbox.Consumer {
	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "inbox"})
	require.NoError(v.t, err)
	return c
}

func (v *env) position(c *inbox.Consumer) uint64 {
	p, err := c.Position(ctx)
	require.NoError(v.t, err)
	return p
}

// credit is the payload the tests' handler applies.
type credit struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

func payload(account string, amount int64) []byte {
	b, _ := json.Marshal(credit{Account: account, Amount: amount})
	return b
}

func msg(id string, pos uint64, data []byte) inbox.Message {
	return inbox.Message{ID: id, Position: pos, Subject: "payments.created", Data: data}
}

// book is the tests' handler: it adds each credit to its account's total
// and count ("total/<account>", "count/<account>", decimal), reading them
// through the commit, and counts its runs. A payload that is not a
// credit is rejected.
type book struct {
	mu   sync.Mutex
	runs int
	// fail, if set, is returned by the next run instead of applying.
	fail error
}

func (b *book) handle(_ context.Context, fx idemkv.Effects, m inbox.Message) error {
	b.mu.Lock()
	b.runs++
	fail := b.fail
	b.fail = nil
	b.mu.Unlock()
	var c credit
	if err := json.Unmarshal(m.Data, &c); err != nil {
		return inbox.Reject(fmt.Errorf("not a credit: %w", err))
	}
	if c.Account == "" || c.Amount <= 0 {
		return inbox.Reject(errors.New("credit without an account or a positive amount"))
	}
	if err := add(fx, "total/"+c.Account, c.Amount); err != nil {
		return err
	}
	if err := add(fx, "count/"+c.Account, 1); err != nil {
		return err
	}
	return fail
}

func (b *book) n() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs
}

func add(fx idemkv.Effects, key string, n int64) error {
	cur := int64(0)
	v, err := fx.Get([]byte(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
	case err != nil:
		return err
	default:
		if cur, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return err
		}
	}
	return fx.Set([]byte(key), strconv.AppendInt(nil, cur+n, 10))
}

// data returns a business value, or "" if it is absent.
func (v *env) data(key string) string {
	b, err := v.e.GetData(ctx, []byte(key))
	if errors.Is(err, idemkv.ErrNotFound) {
		return ""
	}
	require.NoError(v.t, err)
	return string(b)
}

func (v *env) mark(key string) (idemkv.Record, error) {
	return v.e.Get(ctx, idemkv.ID{Tenant: inbox.Tenant, Endpoint: "ledger", Key: key})
}
