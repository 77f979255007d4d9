package payments

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// Errors of Provider.Charge.
var (
	// ErrProviderUnavailable: the provider refused the call before doing
	// anything (its 503): nothing was charged, a retry may run anew.
	ErrProviderUnavailable = errors.New("payments: card processor unavailable; nothing was charged")
	// ErrProviderTimeout: the call timed out; the charge may or may not
	// have happened.
	ErrProviderTimeout = errors.New("payments: card processor timed out; the charge may have happened")
)

// ProviderOptions shape the simulated card processor.
type ProviderOptions struct {
	// Latency is how long each call takes.
	Latency time.Duration
	// FailRate is the fraction of calls refused before charging.
	FailRate float64
	// TimeoutRate is the fraction of calls that charge and then time out,
	// the case that double-charges a client that retries without a key.
	TimeoutRate float64
	// Rand decides failures and timeouts. Default: a random seed.
	Rand *rand.Rand
	// Fault, if set, is asked at every call, after Latency, whether
	// something goes wrong with it, so that a test or the demo can script
	// one call instead of drawing on the rates. It returns nil to let
	// FailRate and TimeoutRate decide, ErrProviderUnavailable to refuse
	// the call before charging, ErrProviderTimeout to charge and lose the
	// answer, or any other error (ctx's, say) to end the call at once,
	// uncharged and uncounted, like a caller that gave up. It may block
	// (until ctx is done), to stall a call on its way to the processor.
	// key is the call's downstream idempotency key. Default: nil.
	Fault func(ctx context.Context, key string) error
	// Remember is how many charges the ledger keeps, and so how many
	// downstream keys it deduplicates: past it, the oldest is forgotten,
	// as a real processor forgets keys after a day or so. Default:
	// 200,000, about 40 MiB.
	Remember int
}

// Provider is a simulated card processor that honours a downstream
// idempotency key, as real ones do: a second charge under a key returns
// the first charge instead of charging again. Its ledger lives in memory,
// bounded (ProviderOptions.Remember); it stands for a remote system and
// does not survive a restart of the process.
type Provider struct {
	opts ProviderOptions

	mu      sync.Mutex
	rnd     *rand.Rand
	charges map[string]Charge // by downstream key
	order   []string          // the keys of charges, oldest first
	made    int               // charges made, forgotten ones included
	calls   int
	dedups  int
}

// Charge is one charge the provider made.
type Charge struct {
	ID       string
	Amount   int64
	Currency string
}

// NewProvider returns a provider with the given behaviour.
func NewProvider(opts ProviderOptions) *Provider {
	r := opts.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if opts.Remember <= 0 {
		opts.Remember = 200_000
	}
	return &Provider{opts: opts, rnd: r, charges: make(map[string]Charge)}
}

// Charge charges amount under the downstream key, or returns the charge
// already made under it. It fails with ErrProviderUnavailable (nothing
// charged), ErrProviderTimeout (charged, answer lost), ctx's error
// (nothing charged) or the error of ProviderOptions.Fault (nothing
// charged).
func (p *Provider) Charge(ctx context.Context, key string, amount int64, currency string) (Charge, error) {
	if p.opts.Latency > 0 {
		t := time.NewTimer(p.opts.Latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return Charge{}, ctx.Err()
		}
	}
	var fault error
	if p.opts.Fault != nil {
		fault = p.opts.Fault(ctx, key)
		if fault != nil && !errors.Is(fault, ErrProviderUnavailable) && !errors.Is(fault, ErrProviderTimeout) {
			return Charge{}, fault
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	roll := p.rnd.Float64()
	if errors.Is(fault, ErrProviderUnavailable) || (fault == nil && roll < p.opts.FailRate) {
		return Charge{}, ErrProviderUnavailable
	}
	c, dup := p.charges[key]
	if dup {
		p.dedups++
	} else {
		c = Charge{ID: "ch_" + randomHex(8), Amount: amount, Currency: currency}
		p.rememberLocked(key, c)
	}
	if errors.Is(fault, ErrProviderTimeout) || (fault == nil && roll < p.opts.FailRate+p.opts.TimeoutRate) {
		return Charge{}, ErrProviderTimeout
	}
	return c, nil
}

// rememberLocked puts c in the ledger under key, forgetting the oldest
// charge past the bound. REQUIRES: p.mu held.
func (p *Provider) rememberLocked(key string, c Charge) {
	p.charges[key] = c
	p.order = append(p.order, key)
	p.made++
	if len(p.order) > p.opts.Remember {
		delete(p.charges, p.order[0])
		p.order[0] = ""
		p.order = p.order[1:]
	}
}

// Lookup returns the charge made under key, if any: the status query a
// reconciler asks.
func (p *Provider) Lookup(key string) (Charge, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.charges[key]
	return c, ok
}

// ProviderStats counts the provider's work.
type ProviderStats struct {
	Calls   int // calls that reached the provider
	Charges int // charges made
	Dedups  int // calls answered with an earlier charge under the same key
}

// Stats returns the provider's counts.
func (p *Provider) Stats() ProviderStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProviderStats{Calls: p.calls, Charges: p.made, Dedups: p.dedups}
}

func randomHex(n int) string {
	b := make([]byte, n)
	crand.Read(b)
	return hex.EncodeToString(b)
}
