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
	// ErrDeclined: the processor declined the card; nothing was charged,
	// and a retry of the same request would be declined again (a final
	// answer, not a failure).
	ErrDeclined = errors.New("payments: the card was declined")
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
	// the call before charging, ErrDeclined to decline the card (nothing
	// charged), ErrProviderTimeout to charge and lose the
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

// ChargeRequest asks a processor for one charge.
type ChargeRequest struct {
	// Key is the downstream idempotency key: a second request under it
	// gets the first charge back instead of a new one.
	Key      string
	Amount   int64
	Currency string
	// Description is kept with the charge, as processors keep a charge's
	// metadata, so that a reconciler can rebuild the payment from it.
	Description string
}

// Processor is the card processor the service charges through: the
// simulated Provider in this process, or a ProcessorClient of an idemkv
// processor over HTTP.
type Processor interface {
	// Charge makes the charge, or returns the one already made under
	// req.Key. It fails with ErrProviderUnavailable (nothing charged),
	// ErrDeclined (nothing charged, for good), ErrProviderTimeout
	// (charged or not: unknown) or ctx's error
	// (nothing charged, the call was not sent).
	Charge(ctx context.Context, req ChargeRequest) (Charge, error)
	// Lookup returns the charge made under key; found is false if the
	// processor has none (and, for the key of an operation that is no
	// longer in flight, never will). An error means the answer is unknown.
	Lookup(ctx context.Context, key string) (c Charge, found bool, err error)
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
	// inflight counts the calls under way under each key: a lookup
	// cannot say "no charge" while one may still make it.
	inflight map[string]int
	made     int // charges made, forgotten ones included
	calls    int
	dedups   int
}

// Charge is one charge a processor made.
type Charge struct {
	ID          string `json:"id"`
	Key         string `json:"key"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description,omitempty"`
}

var _ Processor = (*Provider)(nil)

// NewProvider returns a provider with the given behaviour.
func NewProvider(opts ProviderOptions) *Provider {
	r := opts.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if opts.Remember <= 0 {
		opts.Remember = 200_000
	}
	return &Provider{opts: opts, rnd: r, charges: make(map[string]Charge), inflight: make(map[string]int)}
}

// Charge implements Processor: it charges req.Amount under req.Key, or
// returns the charge already made under it. It fails with
// ErrProviderUnavailable (nothing charged), ErrProviderTimeout (charged,
// answer lost), ctx's error (nothing charged) or the error of
// ProviderOptions.Fault (nothing charged).
func (p *Provider) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	key := req.Key
	p.mu.Lock()
	p.inflight[key]++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.inflight[key]--; p.inflight[key] == 0 {
			delete(p.inflight, key)
		}
		p.mu.Unlock()
	}()
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
			return Charge{}, fault // ErrDeclined, or a caller that gave up: nothing charged
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
		c = Charge{ID: "ch_" + randomHex(8), Key: key, Amount: req.Amount, Currency: req.Currency, Description: req.Description}
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

// Lookup implements Processor: the status query a reconciler asks. A
// key the ledger has forgotten (ProviderOptions.Remember) reads as never
// charged, as with a real processor past its key retention; a key a call
// is still under way for is ErrChargeInFlight, not "never charged".
func (p *Provider) Lookup(_ context.Context, key string) (Charge, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.charges[key]
	if !ok && p.inflight[key] > 0 {
		return Charge{}, false, ErrChargeInFlight
	}
	return c, ok, nil
}

// ErrChargeInFlight is Provider.Lookup's answer while a call under the key
// is still under way: whether it charges is not known yet.
var ErrChargeInFlight = errors.New("payments: a charge under this key is in flight")

// Charges returns every charge the ledger holds, oldest first.
func (p *Provider) Charges() []Charge {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Charge, 0, len(p.order))
	for _, k := range p.order {
		out = append(out, p.charges[k])
	}
	return out
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
