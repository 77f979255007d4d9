package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkv/idemkv/httpidem"
)

// ProcessorClient is a Processor reached over HTTP: an idemkv processor
// (package examples/processor), or any processor with its API. It sends
// the downstream key as the Idempotency-Key header, so the processor
// deduplicates every attempt of one payment into one charge, and the
// call's deadline (ChargeRequest.Deadline) as the Charge-Deadline header
// (RFC 3339, to the nanosecond), past which the processor refuses it.
//
// Its errors are the Processor contract's, read conservatively: only an
// answer that says nothing was charged is ErrProviderUnavailable (a 503;
// ErrCallExpired if its problem type is call-expired) or ErrDeclined (a
// 402), and only a call never sent is ctx's error; a timeout, a lost connection,
// a 5xx, any other status and an answer that does not parse are
// ErrProviderTimeout, charged or not unknown, for the reconciler to ask
// about.
type ProcessorClient struct {
	base    string
	http    *http.Client
	timeout time.Duration
}

// NewProcessorClient returns a client of the processor at base (for
// example http://127.0.0.1:8081) whose calls give up after timeout
// (default 5 s). A nil hc means http.DefaultClient.
func NewProcessorClient(base string, timeout time.Duration, hc *http.Client) (*ProcessorClient, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("payments: processor URL %q: want http://host:port", base)
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &ProcessorClient{base: strings.TrimSuffix(base, "/"), http: hc, timeout: timeout}, nil
}

var _ Processor = (*ProcessorClient)(nil)

// Charge implements Processor.
func (p *ProcessorClient) Charge(ctx context.Context, req ChargeRequest) (Charge, error) {
	if err := ctx.Err(); err != nil {
		return Charge{}, err // not sent: nothing charged
	}
	body, _ := json.Marshal(map[string]any{"amount": req.Amount, "currency": req.Currency, "description": req.Description})
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(cctx, http.MethodPost, p.base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return Charge{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", req.Key)
	if !req.Deadline.IsZero() {
		hreq.Header.Set(HeaderChargeDeadline, req.Deadline.UTC().Format(time.RFC3339Nano))
	}
	resp, err := p.http.Do(hreq)
	if err != nil {
		return Charge{}, fmt.Errorf("%w: %w", ErrProviderTimeout, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		c, err := readCharge(resp.Body, req.Key)
		if err != nil {
			return Charge{}, fmt.Errorf("%w: %w", ErrProviderTimeout, err)
		}
		return c, nil
	case http.StatusServiceUnavailable:
		if problemType(resp) == problemCallExpired {
			return Charge{}, ErrCallExpired
		}
		return Charge{}, ErrProviderUnavailable
	case http.StatusPaymentRequired:
		return Charge{}, ErrDeclined
	}
	return Charge{}, fmt.Errorf("%w: the processor answered %s", ErrProviderTimeout, resp.Status)
}

// Lookup implements Processor.
func (p *ProcessorClient) Lookup(ctx context.Context, key string) (Charge, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(cctx, http.MethodGet, p.base+"/v1/charges/"+url.PathEscape(key), nil)
	if err != nil {
		return Charge{}, false, err
	}
	resp, err := p.http.Do(hreq)
	if err != nil {
		return Charge{}, false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		c, err := readCharge(resp.Body, key)
		return c, err == nil, err
	case http.StatusNotFound:
		return Charge{}, false, nil
	}
	return Charge{}, false, fmt.Errorf("payments: processor lookup answered %s", resp.Status)
}

// HeaderChargeDeadline carries a charge call's deadline
// (ChargeRequest.Deadline), in RFC 3339 with up to nanoseconds: an idemkv
// processor refuses a call that reaches it later with a 503 whose problem
// type ends in "call-expired".
const HeaderChargeDeadline = "Charge-Deadline"

// problemCallExpired is the last segment of the problem type of a call
// refused for arriving after its deadline.
const problemCallExpired = "call-expired"

// problemType returns the last segment (after a "/" or a "#") of a
// problem answer's type ("" for another answer).
func problemType(resp *http.Response) string {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return ""
	}
	var p httpidem.Problem
	if json.NewDecoder(io.LimitReader(resp.Body, 16<<10)).Decode(&p) != nil {
		return ""
	}
	return p.Type[strings.LastIndexAny(p.Type, "/#")+1:]
}

// readCharge decodes a charge answer and checks that it is one: an id,
// the key asked about, a positive amount and a currency.
func readCharge(r io.Reader, key string) (Charge, error) {
	var c Charge
	if err := json.NewDecoder(io.LimitReader(r, 64<<10)).Decode(&c); err != nil {
		return Charge{}, fmt.Errorf("payments: processor answer: %w", err)
	}
	if c.ID == "" || c.Key != key || c.Amount <= 0 || !isCurrency(c.Currency) {
		return Charge{}, errors.New("payments: processor answer is not a charge under the key asked about")
	}
	return c, nil
}
