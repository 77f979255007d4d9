package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/fakeclock"
	"github.com/idemkv/idemkv/internal/layertest/teststore"
	"github.com/idemkv/idemkv/once"
	"github.com/idemkv/idemkv/ttl"
)

// TestMain runs the suite on the engine (and then looks for leaked
// goroutines), then on PostgreSQL (teststore).
func TestMain(m *testing.M) { teststore.Main(m, func() error { return goleak.Find() }) }

var _ inbox.Store = (*engine.Engine)(nil)

var ctx = context.Background()

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// markWindow is the retention of the tests' dedup marks (class "inbox").
const markWindow = 7 * 24 * time.Hour

// env is a real store (teststore: the engine in a temporary directory,
// or PostgreSQL), on a fake clock, with the retention class "inbox".
type env struct {
	t     *testing.T
	dir   string
	clock *fakeclock.Clock
	e     teststore.Store
}

func newEnv(t *testing.T) *env {
	v := &env{t: t, dir: t.TempDir(), clock: fakeclock.New(t0)}
	v.open()
	t.Cleanup(func() { _ = v.e.Close() })
	return v
}

func (v *env) open() {
	v.e = teststore.Open(v.t, v.dir, teststore.Options{Clock: v.clock, RetentionClasses: ttl.Classes{"inbox": markWindow}})
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

func TestRedeliveryAppliesOnce(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	m := msg("ev-1", 1, payload("acct_1", 500))
	out, err := c.Process(ctx, m, b.handle)
	require.NoError(t, err)
	assert.Equal(t, inbox.Outcome{Key: "id/ev-1"}, out)
	assert.True(t, out.Applied())
	assert.Equal(t, 1, b.n(), "one run: the result is set in the commit")

	for range 3 {
		out, err = c.Process(ctx, m, b.handle)
		require.NoError(t, err)
		assert.Equal(t, inbox.Outcome{Key: "id/ev-1", Duplicate: true}, out)
	}
	assert.Equal(t, 1, b.n(), "a duplicate runs nothing")
	assert.Equal(t, "500", v.data("total/acct_1"))
	assert.Equal(t, "1", v.data("count/acct_1"))
	assert.Equal(t, uint64(1), v.position(c))

	rec, err := v.mark("id/ev-1")
	require.NoError(t, err)
	assert.Equal(t, idemkv.StateCompleted, rec.State)
	assert.Equal(t, "inbox", rec.Class, "the mark has the consumer's retention class")
	assert.True(t, t0.Add(markWindow).Equal(rec.Expires), "expires %v", rec.Expires)
	assert.Equal(t, 3, rec.Effects, "total, count and position commit with the mark")
}

func TestEventsWithoutID(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	first, err := c.Process(ctx, msg("", 1, []byte(`{"account":"acct_1","amount":100}`)), b.handle)
	require.NoError(t, err)
	require.True(t, first.Applied())
	assert.True(t, strings.HasPrefix(first.Key, "sha256/"), first.Key)
	assert.NoError(t, idemkv.ValidateKey(first.Key))

	// The same content, redelivered, and spelled differently: one event.
	for _, data := range []string{
		`{"account":"acct_1","amount":100}`,
		`{ "amount": 1e2, "account": "acct_1" }`,
	} {
		out, err := c.Process(ctx, msg("", 2, []byte(data)), b.handle)
		require.NoError(t, err)
		assert.Equal(t, inbox.Outcome{Key: first.Key, Duplicate: true}, out, data)
	}
	// Another payload, or the same payload on another subject: another
	// event.
	out, err := c.Process(ctx, msg("", 3, []byte(`{"account":"acct_1","amount":101}`)), b.handle)
	require.NoError(t, err)
	assert.True(t, out.Applied())
	other := msg("", 4, []byte(`{"account":"acct_1","amount":100}`))
	other.Subject = "payments.replayed"
	out, err = c.Process(ctx, other, b.handle)
	require.NoError(t, err)
	assert.True(t, out.Applied())

	assert.Equal(t, "301", v.data("total/acct_1"))
	assert.Equal(t, "3", v.data("count/acct_1"))
	assert.Equal(t, uint64(4), v.position(c))
}

func TestEventKeys(t *testing.T) {
	v := newEnv(t)
	c := v.consumer()
	noop := func(context.Context, idemkv.Effects, inbox.Message) error { return nil }
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		id, prefix string
	}{
		{"pay_42.created", "id/pay_42.created"},
		{strings.Repeat("y", 252), "id/" + strings.Repeat("y", 252)},
		{strings.Repeat("y", 253), "id-sha256/"},
		{long, "id-sha256/"},
		{"caf\u00e9", "id-sha256/"},
		{"line\nbreak", "id-sha256/"},
		{"", "sha256/"},
	} {
		out, err := c.Process(ctx, inbox.Message{ID: tc.id, Subject: "s", Data: []byte(tc.id)}, noop)
		require.NoError(t, err, tc.id)
		assert.True(t, strings.HasPrefix(out.Key, tc.prefix), "%q: key %q", tc.id, out.Key)
		assert.NoError(t, idemkv.ValidateKey(out.Key))
		again, err := c.Process(ctx, inbox.Message{ID: tc.id, Subject: "s", Data: []byte(tc.id)}, noop)
		require.NoError(t, err)
		assert.True(t, again.Duplicate, tc.id)
	}
}

// TestPositionFollowsEffects processes a sequence of deliveries (new
// events, copies further on in the stream, late copies, a rejection) and
// checks after each that the position and the ledger agree: the position
// is the highest position settled, and the ledger holds exactly the
// events applied by then.
func TestPositionFollowsEffects(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	applied := map[string]int64{}
	for i, step := range []struct {
		id     string
		pos    uint64
		amount int64
		want   inbox.Outcome
	}{
		{"ev-1", 1, 10, inbox.Outcome{}},
		{"ev-2", 2, 20, inbox.Outcome{}},
		{"ev-1", 3, 10, inbox.Outcome{Duplicate: true}}, // a copy stored again: the position moves past it
		{"ev-3", 5, 30, inbox.Outcome{}},                // a gap (a deleted message)
		{"ev-2", 4, 20, inbox.Outcome{Duplicate: true}}, // late: the position stays
		{"ev-4", 0, 40, inbox.Outcome{}},                // no position: it stays
		{"ev-5", 6, -1, inbox.Outcome{Rejected: true, Reason: "credit without an account or a positive amount"}},
		{"ev-5", 7, -1, inbox.Outcome{Duplicate: true, Rejected: true, Reason: "credit without an account or a positive amount"}},
		{"ev-6", 8, 60, inbox.Outcome{}},
	} {
		out, err := c.Process(ctx, msg(step.id, step.pos, payload("acct_1", step.amount)), b.handle)
		require.NoError(t, err, "step %d", i)
		step.want.Key = "id/" + step.id
		require.Equal(t, step.want, out, "step %d", i)
		if out.Applied() {
			applied[step.id] = step.amount
		}
		var total int64
		for _, a := range applied {
			total += a
		}
		require.Equal(t, strconv.FormatInt(total, 10), v.data("total/acct_1"), "step %d", i)
		require.Equal(t, strconv.Itoa(len(applied)), v.data("count/acct_1"), "step %d", i)
		want := map[int]uint64{0: 1, 1: 2, 2: 3, 3: 5, 4: 5, 5: 5, 6: 6, 7: 7, 8: 8}[i]
		require.Equal(t, want, v.position(c), "step %d", i)
	}
	// The copies at 3 and 7 moved the position in commits of their own;
	// the late copy at 4 wrote nothing.
	require.Equal(t, []string{"pos/3", "pos/7"}, v.positionMarks())
}

// positionMarks lists the completed commits that advanced the position
// past a duplicate, by the position they advanced it to ("pos/N", also
// for "pos/N/<random>", made again after a reset).
func (v *env) positionMarks() []string {
	var marks []string
	page, err := v.e.(idemkv.Scanner).Scan(ctx, idemkv.ScanRequest{Tenant: inbox.Tenant, Limit: 1000})
	require.NoError(v.t, err)
	require.Empty(v.t, page.Next)
	for _, rec := range page.Records {
		if strings.HasPrefix(rec.ID.Key, "pos/") {
			require.Equal(v.t, idemkv.StateCompleted, rec.State, rec.ID.Key)
			mark, _, _ := strings.Cut(strings.TrimPrefix(rec.ID.Key, "pos/"), "/") // without the suffix of a mark made again
			marks = append(marks, "pos/"+mark)
		}
	}
	slices.Sort(marks)
	return marks
}

func TestHandlerErrorLeavesNothing(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	_, err := c.Process(ctx, msg("ev-1", 1, payload("acct_1", 10)), b.handle)
	require.NoError(t, err)

	down := errors.New("fx rates unavailable")
	b.fail = down
	m := msg("ev-2", 2, payload("acct_1", 20))
	out, err := c.Process(ctx, m, b.handle)
	require.Equal(t, down, err, "the handler's error, as it is")
	assert.Equal(t, inbox.Outcome{}, out)
	assert.Equal(t, "10", v.data("total/acct_1"), "its writes were dropped")
	assert.Equal(t, uint64(1), v.position(c), "and the position with them")
	_, err = v.mark("id/ev-2")
	require.ErrorIs(t, err, idemkv.ErrNotFound, "and the mark")

	out, err = c.Process(ctx, m, b.handle)
	require.NoError(t, err)
	assert.True(t, out.Applied(), "the next attempt applies")
	assert.Equal(t, "30", v.data("total/acct_1"))
	assert.Equal(t, uint64(2), v.position(c))
}

func TestRejectedPoisonIsSkippedForGood(t *testing.T) {
	v := newEnv(t)
	c := v.consumer()
	runs := 0
	h := func(_ context.Context, fx idemkv.Effects, m inbox.Message) error {
		runs++
		if err := fx.Set([]byte("seen/"+m.ID), []byte("yes")); err != nil { // written before it finds the fault
			return err
		}
		if !json.Valid(m.Data) {
			return inbox.Reject(errors.New("payload is not JSON"))
		}
		return nil
	}
	poison := msg("ev-bad", 1, []byte("\x00garbage"))
	out, err := c.Process(ctx, poison, h)
	require.NoError(t, err, "a rejection settles the message: acknowledge it")
	assert.Equal(t, inbox.Outcome{Key: "id/ev-bad", Rejected: true, Reason: "payload is not JSON"}, out)
	assert.False(t, out.Applied())
	assert.Empty(t, v.data("seen/ev-bad"), "the handler's writes were dropped")
	assert.Equal(t, uint64(1), v.position(c), "the position moved past it")
	rec, err := v.mark("id/ev-bad")
	require.NoError(t, err)
	assert.Equal(t, 422, rec.Result.Status)
	assert.Equal(t, "payload is not JSON", string(rec.Result.Body))

	v.reopen()
	c = v.consumer()
	out, err = c.Process(ctx, poison, h)
	require.NoError(t, err)
	assert.Equal(t, inbox.Outcome{Key: "id/ev-bad", Duplicate: true, Rejected: true, Reason: "payload is not JSON"}, out)
	assert.Equal(t, 1, runs, "never handled again, across a restart")

	out, err = c.Process(ctx, msg("ev-good", 2, []byte(`{}`)), h)
	require.NoError(t, err)
	assert.True(t, out.Applied())
	assert.Equal(t, "yes", v.data("seen/ev-good"))

	// ErrRejected itself, wrapped, is a rejection too; the reason is the
	// whole message, clipped.
	out, err = c.Process(ctx, msg("ev-long", 3, nil), func(context.Context, idemkv.Effects, inbox.Message) error {
		return fmt.Errorf("%w: %s", inbox.ErrRejected, strings.Repeat("r", 2000))
	})
	require.NoError(t, err)
	assert.True(t, out.Rejected)
	assert.Len(t, out.Reason, 1024)
	assert.True(t, strings.HasPrefix(out.Reason, "inbox: event rejected: rrr"))
}

func TestRejectMatching(t *testing.T) {
	assert.NoError(t, inbox.Reject(nil))
	cause := errors.New("bad amount")
	err := fmt.Errorf("ledger: %w", inbox.Reject(cause))
	assert.ErrorIs(t, err, inbox.ErrRejected)
	assert.ErrorIs(t, err, cause)
	assert.Equal(t, "ledger: bad amount", err.Error())
}

func TestIDReusedWithOtherContent(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	_, err := c.Process(ctx, msg("ev-1", 1, payload("acct_1", 10)), b.handle)
	require.NoError(t, err)
	out, err := c.Process(ctx, msg("ev-1", 2, payload("acct_1", 99)), b.handle)
	require.NoError(t, err)
	assert.Equal(t, inbox.Outcome{Key: "id/ev-1", Duplicate: true, Mismatch: true}, out)
	assert.Equal(t, 1, b.n())
	assert.Equal(t, "10", v.data("total/acct_1"), "the id says it is the same event")
	assert.Equal(t, uint64(2), v.position(c))
}

// TestRestartResumesFromPosition: a consumer that stops between messages
// (a crash: the engine closed and opened again, a new Consumer) resumes
// from the committed position, and a message whose handler failed before
// the crash is applied after it, once.
func TestRestartResumesFromPosition(t *testing.T) {
	v := newEnv(t)
	b := &book{}
	stream := make([]inbox.Message, 6)
	for i := range stream {
		stream[i] = msg(fmt.Sprintf("ev-%d", i+1), uint64(i+1), payload("acct_1", int64(i+1)))
	}
	c := v.consumer()
	for _, m := range stream[:3] {
		_, err := c.Process(ctx, m, b.handle)
		require.NoError(t, err)
	}
	b.fail = errors.New("crashing")
	_, err := c.Process(ctx, stream[3], b.handle)
	require.Error(t, err)

	v.reopen()
	c = v.consumer()
	pos := v.position(c)
	require.Equal(t, uint64(3), pos)
	// The broker redelivers from the start (it knows nothing); the
	// consumer reads from pos+1. Both end the same.
	for _, m := range stream[pos:] {
		out, err := c.Process(ctx, m, b.handle)
		require.NoError(t, err)
		require.True(t, out.Applied(), m.ID)
	}
	for _, m := range stream {
		out, err := c.Process(ctx, m, b.handle)
		require.NoError(t, err)
		require.True(t, out.Duplicate, m.ID)
	}
	assert.Equal(t, "21", v.data("total/acct_1"), "1+2+...+6, each once")
	assert.Equal(t, "6", v.data("count/acct_1"))
	assert.Equal(t, uint64(6), v.position(c))
}

// TestConcurrentDeliveries: copies of one event delivered at once apply
// it once; a copy that finds another in flight is told to come back
// (once.ErrInProgress), as a broker would redeliver it.
func TestConcurrentDeliveries(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[bool]int{}
	for range 8 {
		wg.Go(func() {
			<-start
			for {
				out, err := c.Process(ctx, msg("ev-1", 1, payload("acct_1", 7)), b.handle)
				if errors.Is(err, once.ErrInProgress) {
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				outcomes[out.Duplicate]++
				mu.Unlock()
				return
			}
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, map[bool]int{false: 1, true: 7}, outcomes)
	assert.Equal(t, "7", v.data("total/acct_1"))
}

// TestMarksExpire: a mark is kept for its class's window and swept after
// it; a copy arriving later is applied again (the documented limit).
func TestMarksExpire(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	m := msg("ev-1", 1, payload("acct_1", 5))
	_, err := c.Process(ctx, m, b.handle)
	require.NoError(t, err)

	v.clock.Advance(markWindow - time.Second)
	out, err := c.Process(ctx, m, b.handle)
	require.NoError(t, err)
	assert.True(t, out.Duplicate, "within the window")

	v.clock.Advance(2 * time.Second)
	_, err = v.mark("id/ev-1")
	require.ErrorIs(t, err, idemkv.ErrNotFound, "expired")
	out, err = c.Process(ctx, m, b.handle)
	require.NoError(t, err)
	assert.True(t, out.Applied(), "past the window a copy is a new event")
	assert.Equal(t, "10", v.data("total/acct_1"))

	// The sweeper gives the space back within a bucket's width after the
	// window (engine.BucketsPerWindow).
	v.clock.Advance(markWindow + markWindow/engine.BucketsPerWindow)
	pass, err := v.e.Sweep(ctx)
	require.NoError(t, err)
	// The engine keeps the first mark until its bucket goes; PostgreSQL
	// replaced it in place when the copy claimed the key again.
	want := 2
	if teststore.Postgres() {
		want = 1
	}
	assert.Equal(t, want, pass.Deleted, "every mark of ev-1")
}

func TestInvalid(t *testing.T) {
	v := newEnv(t)
	for _, name := range []string{"", "a/b", "with space", strings.Repeat("n", 201)} {
		_, err := inbox.New(name, v.e, nil)
		require.ErrorIs(t, err, idemkv.ErrInvalidArgument, name)
	}
	_, err := inbox.New("ok", nil, nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)

	c, err := inbox.New("ledger", v.e, &inbox.Options{Retention: "no-such-class"})
	require.NoError(t, err)
	b := &book{}
	_, err = c.Process(ctx, msg("ev-1", 1, payload("a", 1)), b.handle)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument, "the class reaches the store")
	assert.Zero(t, b.n())
	_, err = c.Process(ctx, msg("ev-1", 1, nil), nil)
	require.ErrorIs(t, err, idemkv.ErrInvalidArgument)

	// A position that is not a number is reported, not read as 0.
	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(c.PositionKey(), []byte("07")) }))
	_, err = c.Position(ctx)
	require.ErrorContains(t, err, "not a decimal number")
}

// TestCatchUpAfterAPositionReset: a consumer reset to 0 by hand reads
// its stream again, every message a copy of an event settled before. Its
// position catches up with each copy, as it did the first time, though
// the commits that moved it then are still kept.
func TestCatchUpAfterAPositionReset(t *testing.T) {
	v := newEnv(t)
	c, b := v.consumer(), &book{}
	stream := []inbox.Message{msg("ev-1", 1, payload("acct_1", 10)), msg("ev-1", 2, payload("acct_1", 10))}
	for _, m := range stream {
		_, err := c.Process(ctx, m, b.handle)
		require.NoError(t, err)
	}
	require.Equal(t, uint64(2), v.position(c))

	require.NoError(t, v.e.Update(ctx, func(fx idemkv.Effects) error { return fx.Set(c.PositionKey(), []byte("0")) }))
	for i, m := range stream {
		out, err := c.Process(ctx, m, b.handle)
		require.NoError(t, err)
		require.True(t, out.Duplicate)
		require.Equal(t, uint64(i+1), v.position(c), "message %d", i)
	}
	require.Equal(t, []string{"pos/1", "pos/2", "pos/2"}, v.positionMarks())
	require.Equal(t, "10", v.data("total/acct_1"), "applied once")
}
