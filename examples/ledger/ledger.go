package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/inbox"
)

// Topic is the topic of the events the ledger applies.
const Topic = "payments.created"

// Name is the ledger's consumer name: its dedup marks and its position
// are kept under it.
const Name = "ledger"

// Event is the part of a payments.created payload the ledger reads
// (examples/payments' CreatedEvent carries these members and more).
type Event struct {
	Payment string `json:"payment"`
	Account string `json:"account"`
	// Amount is in minor units (cents), above 0.
	Amount int64 `json:"amount"`
	// Currency is the ISO 4217 code, upper case.
	Currency string `json:"currency"`
}

// Balance is what the ledger keeps per account and currency.
type Balance struct {
	// Total is the sum of the amounts applied, in minor units.
	Total int64 `json:"total"`
	// Count is the number of events applied.
	Count int64 `json:"count"`
}

// New returns the ledger's consumer on store.
func New(store inbox.Store, opts *inbox.Options) (*inbox.Consumer, error) {
	return inbox.New(Name, store, opts)
}

// Handle is the ledger's inbox.Handler: it adds a payments.created
// event's amount to its account's balance, and rejects (inbox.Reject) an
// event that is not one the ledger can apply.
func Handle(_ context.Context, fx idemkv.Effects, msg inbox.Message) error {
	if msg.Subject != Topic && !strings.HasSuffix(msg.Subject, "."+Topic) {
		return nil // not ours: settled without effect
	}
	ev, err := parse(msg.Data)
	if err != nil {
		return inbox.Reject(err)
	}
	key, err := balanceKey(ev.Account, ev.Currency)
	if err != nil {
		return inbox.Reject(err)
	}
	b, err := get(fx.Get, key)
	if err != nil {
		return err
	}
	if b.Total > math.MaxInt64-ev.Amount {
		return inbox.Reject(fmt.Errorf("ledger: payment %q: the total of %s %s would overflow", ev.Payment, ev.Account, ev.Currency))
	}
	b.Total += ev.Amount
	b.Count++
	v, err := json.Marshal(b)
	if err != nil {
		return err
	}
	return fx.Set(key, v)
}

// parse decodes and checks an event's payload.
func parse(data []byte) (Event, error) {
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return Event{}, fmt.Errorf("ledger: payload is not a payments.created event: %w", err)
	}
	switch {
	case ev.Account == "":
		return Event{}, fmt.Errorf("ledger: payment %q: no account", ev.Payment)
	case ev.Amount <= 0:
		return Event{}, fmt.Errorf("ledger: payment %q: amount %d is not above 0", ev.Payment, ev.Amount)
	case !validCurrency(ev.Currency):
		return Event{}, fmt.Errorf("ledger: payment %q: currency %q is not an ISO 4217 code in upper case", ev.Payment, ev.Currency)
	}
	return ev, nil
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// balanceKey is the business key of account's balance in currency. An
// account that is not a valid idemkv scope (empty, over 255 bytes, not
// UTF-8) has none.
func balanceKey(account, currency string) ([]byte, error) {
	k, err := idemkv.AppendTenantKey(nil, account, []byte("ledger/balance/"+currency))
	if err != nil {
		return nil, fmt.Errorf("ledger: account %q: %w", account, err)
	}
	return k, nil
}

// get reads a balance through read (Effects.Get or a store's GetData);
// an absent one is zero.
func get(read func([]byte) ([]byte, error), key []byte) (Balance, error) {
	var b Balance
	v, err := read(key)
	if errors.Is(err, idemkv.ErrNotFound) {
		return b, nil
	}
	if err != nil {
		return b, err
	}
	if err := json.Unmarshal(v, &b); err != nil {
		return b, fmt.Errorf("ledger: stored balance %q: %w", key, err)
	}
	return b, nil
}

// Read returns account's committed balance in currency (zero if it has
// none) from store's business data.
func Read(ctx context.Context, store inbox.Store, account, currency string) (Balance, error) {
	key, err := balanceKey(account, currency)
	if err != nil {
		return Balance{}, err
	}
	return get(func(k []byte) ([]byte, error) { return store.GetData(ctx, k) }, key)
}
