package payments

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
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
	// ErrCallExpired: the call reached the processor after its deadline
	// (ChargeRequest.Deadline) and was refused before charging. It wraps
	// ErrProviderUnavailable: nothing was charged.
	ErrCallExpired = fmt.Errorf("%w: the call arrived after its deadline", ErrProviderUnavailable)
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
	// Remember is how many charges the ledger in memory keeps, and so how
	// many downstream keys it deduplicates: past it, the oldest is
	// forgotten, as a real processor forgets keys after a day or so.
	// Default: 200,000, about 40 MiB. A Ledger keeps every charge.
	Remember int
	// Clock tells the time a call arrives, which its deadline is
	// compared with (ChargeRequest.Deadline). Default: the system clock.
	Clock idemkv.Clock
	// Ledger, if set, keeps the charges durably (ledger.go), so that a
	// provider started anew on it, after a restart of the process, still
	// finds and deduplicates every charge made before: a reconciler that
	// asks it about a payment whose answer was lost hears the truth, not
	// "never charged". Default: nil, a ledger in memory, which a restart
	// empties.
	Ledger Ledger
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
	// Deadline, if set, is the last moment the call may reach the
	// processor: a call that arrives later is refused (ErrCallExpired)
	// and charges nothing, unless a charge was made under Key already,
	// which it gets back. The service sends the end of the lease its
	// attempt holds, or of the call's timeout if sooner, so that a call
	// held back by a paused process or a slow network cannot land after
	// a reconciler, asking once both have passed, heard "no charge".
	Deadline time.Time
}

// Processor is the card processor the service charges through: the
// simulated Provider in this process, or a ProcessorClient of an idemkv
// processor over HTTP.
type Processor interface {
	// Charge makes the charge, or returns the one already made under
	// req.Key. A call that reaches the processor after req.Deadline (if
	// set) charges nothing: it fails with ErrCallExpired, or gets the
	// charge already made. It fails with ErrProviderUnavailable (nothing
	// charged),
	// ErrDeclined (nothing charged, for good), ErrProviderTimeout
	// (charged or not: unknown) or ctx's error (the call ended because
	// ctx did). The service reads any error but the first two as
	// unknown: a call cut short on its way may still land. Only a ctx
	// already done before Charge is called proves nothing was sent, and
	// the service checks that itself.
	Charge(ctx context.Context, req ChargeRequest) (Charge, error)
	// Lookup returns the charge made under key; found is false if the
	// processor has none, and then never will for calls whose deadline
	// has passed by the processor's clock. An error means the answer is
	// unknown.
	Lookup(ctx context.Context, key string) (c Charge, found bool, err error)
}

// Provider is a simulated card processor that honours a downstream
// idempotency key, as real ones do: a second charge under a key returns
// the first charge instead of charging again. It keeps its charges in a
// durable Ledger (ProviderOptions.Ledger), which outlives the process as
// a remote processor's would, or else in memory, bounded
// (ProviderOptions.Remember), forgotten when the process ends.
type Provider struct {
	opts ProviderOptions
	book book

	mu  sync.Mutex
	rnd *rand.Rand
	// inflight counts the calls under way under each key: a lookup
	// cannot say "no charge" while one may still make it. Calls end with
	// the process, so it need not outlive it.
	inflight map[string]int
	made     int // charges made by this provider, forgotten ones included
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
	var b book = &memBook{remember: opts.Remember, charges: make(map[string]Charge)}
	if opts.Ledger != nil {
		b = ledgerBook{opts.Ledger}
	}
	return &Provider{opts: opts, book: b, rnd: r, inflight: make(map[string]int)}
}

// Charge implements Processor: it charges req.Amount under req.Key, or
// returns the charge already made under it. It fails with
// ErrProviderUnavailable (nothing charged), ErrProviderTimeout (charged,
// answer lost), ErrCallExpired (it arrived past req.Deadline: nothing
// charged), ctx's error (nothing charged) or the error of
// ProviderOptions.Fault (nothing charged). A call arrives when Charge is
// called: Latency and Fault are its time at the processor, during which
// Lookup answers ErrChargeInFlight.
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
	// The call arrives here, and is counted in flight from here on:
	// Latency and Fault are its time at the processor.
	if late, c, err := p.late(ctx, req); late {
		return c, err
	}
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
	p.calls++
	roll := p.rnd.Float64()
	p.mu.Unlock()
	if errors.Is(fault, ErrProviderUnavailable) || (fault == nil && roll < p.opts.FailRate) {
		return Charge{}, ErrProviderUnavailable
	}
	// The call has landed: it charges whether or not its caller still
	// waits.
	c, made, err := p.book.chargeOnce(context.WithoutCancel(ctx), key, func() Charge {
		return Charge{ID: "ch_" + randomHex(8), Key: key, Amount: req.Amount, Currency: req.Currency, Description: req.Description}
	})
	if err != nil {
		// The ledger's write failed, committed or not: the caller cannot
		// know whether it was charged.
		return Charge{}, fmt.Errorf("%w: the ledger: %w", ErrProviderTimeout, err)
	}
	p.mu.Lock()
	if made {
		p.made++
	} else {
		p.dedups++
	}
	p.mu.Unlock()
	if errors.Is(fault, ErrProviderTimeout) || (fault == nil && roll < p.opts.FailRate+p.opts.TimeoutRate) {
		return Charge{}, ErrProviderTimeout
	}
	return c, nil
}

// late answers a call that arrived after its deadline: with the charge
// already made under its key, or ErrCallExpired. It reports false for a
// call in time.
func (p *Provider) late(ctx context.Context, req ChargeRequest) (bool, Charge, error) {
	if req.Deadline.IsZero() || !p.now().After(req.Deadline) {
		return false, Charge{}, nil
	}
	c, ok, err := p.book.get(ctx, req.Key)
	switch {
	case err != nil:
		return true, Charge{}, fmt.Errorf("%w: the ledger: %w", ErrProviderTimeout, err)
	case ok:
		p.mu.Lock()
		p.dedups++
		p.mu.Unlock()
		return true, c, nil
	}
	return true, Charge{}, ErrCallExpired
}

func (p *Provider) now() time.Time {
	if p.opts.Clock != nil {
		return p.opts.Clock.Now()
	}
	return time.Now()
}

// Lookup implements Processor: the status query a reconciler asks. A
// key the ledger in memory has forgotten (ProviderOptions.Remember) reads
// as never charged, as with a real processor past its key retention; a
// key a call is still under way for is ErrChargeInFlight, not "never
// charged"; a Ledger's read error is returned as it is.
func (p *Provider) Lookup(ctx context.Context, key string) (Charge, bool, error) {
	// In-flight calls first: a call counted here that lands before the
	// ledger is read is found there; one that starts after began after
	// the question was asked.
	p.mu.Lock()
	inflight := p.inflight[key] > 0
	p.mu.Unlock()
	c, ok, err := p.book.get(ctx, key)
	switch {
	case err != nil:
		return Charge{}, false, err
	case !ok && inflight:
		return Charge{}, false, ErrChargeInFlight
	}
	return c, ok, nil
}

// ErrChargeInFlight is Provider.Lookup's answer while a call under the key
// is still under way: whether it charges is not known yet.
var ErrChargeInFlight = errors.New("payments: a charge under this key is in flight")

// Charges returns every charge the ledger holds: oldest first in memory,
// by key in a Ledger. It returns nil if a Ledger cannot be read.
func (p *Provider) Charges(ctx context.Context) []Charge {
	all, err := p.book.all(ctx)
	if err != nil {
		return nil
	}
	return all
}

// ProviderStats counts the provider's work since NewProvider (a Ledger
// keeps the charges, not the counts).
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
