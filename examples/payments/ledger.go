package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/idemkv/idemkv"
)

// A Ledger keeps a simulated Provider's charges durably: a store of its
// own, an *engine.Engine on a directory of its own (idemkv serve opens
// DATA/processor), standing for the processor's database. Not the
// service's store: a processor's ledger does not go back in time when the
// merchant restores a backup of its own. Every charge is written before
// the call's answer, in a transaction that first looks for one under the
// same key, so two calls under one key make one charge even when they
// race, and nothing is ever forgotten.
type Ledger = idemkv.DataStore

// book is where a Provider keeps its charges: in memory (memBook) or in a
// Ledger (ledgerBook).
type book interface {
	// chargeOnce returns the charge under key, making it with mk if there
	// is none; made says whether it was made now. An error leaves unknown
	// whether it was.
	chargeOnce(ctx context.Context, key string, mk func() Charge) (c Charge, made bool, err error)
	// get returns the charge under key, if there is one.
	get(ctx context.Context, key string) (Charge, bool, error)
	// all returns every charge kept.
	all(ctx context.Context) ([]Charge, error)
}

// memBook keeps the last remember charges in memory.
type memBook struct {
	remember int

	mu      sync.Mutex
	charges map[string]Charge // by downstream key
	order   []string          // the keys of charges, oldest first
}

func (b *memBook) chargeOnce(_ context.Context, key string, mk func() Charge) (Charge, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.charges[key]; ok {
		return c, false, nil
	}
	c := mk()
	b.charges[key] = c
	b.order = append(b.order, key)
	if len(b.order) > b.remember {
		delete(b.charges, b.order[0])
		b.order[0] = ""
		b.order = b.order[1:]
	}
	return c, true, nil
}

func (b *memBook) get(_ context.Context, key string) (Charge, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.charges[key]
	return c, ok, nil
}

func (b *memBook) all(context.Context) ([]Charge, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Charge, 0, len(b.order))
	for _, k := range b.order {
		out = append(out, b.charges[k])
	}
	return out, nil
}

// ledgerBook keeps every charge in a Ledger, as JSON under
// "charge/" + downstream key.
type ledgerBook struct{ l Ledger }

const ledgerPrefix = "charge/"

func ledgerKey(key string) []byte { return []byte(ledgerPrefix + key) }

func (b ledgerBook) chargeOnce(ctx context.Context, key string, mk func() Charge) (c Charge, made bool, err error) {
	err = b.l.Update(ctx, func(fx idemkv.Effects) error {
		v, err := fx.Get(ledgerKey(key))
		switch {
		case err == nil:
			made = false
			return json.Unmarshal(v, &c)
		case !errors.Is(err, idemkv.ErrNotFound):
			return err
		}
		c, made = mk(), true
		row, _ := json.Marshal(c)
		return fx.Set(ledgerKey(key), row)
	})
	return c, made, err
}

func (b ledgerBook) get(ctx context.Context, key string) (Charge, bool, error) {
	var c Charge
	v, err := b.l.GetData(ctx, ledgerKey(key))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		return c, false, nil
	case err != nil:
		return c, false, err
	}
	if err := json.Unmarshal(v, &c); err != nil {
		return c, false, fmt.Errorf("payments: ledger entry of %s: %w", key, err)
	}
	return c, true, nil
}

func (b ledgerBook) all(ctx context.Context) ([]Charge, error) {
	var out []Charge
	var bad error
	err := b.l.ScanData(ctx, []byte(ledgerPrefix), func(_, v []byte) bool {
		var c Charge
		if bad = json.Unmarshal(v, &c); bad != nil {
			return false
		}
		out = append(out, c)
		return true
	})
	return out, errors.Join(err, bad)
}
