package once_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/once"
)

// A message consumer credits an account once per message, however often
// the message is delivered. The credit reads the balance and writes it
// back in the commit that stores the outcome.
func Example() {
	dir, err := os.MkdirTemp("", "once-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := engine.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	type credit struct {
		Account string `json:"account"`
		Amount  int    `json:"amount"`
	}
	msg := credit{Account: "acct_42", Amount: 5000}
	fp, err := fingerprint.ComputeValue("ledger.credit", msg, nil)
	if err != nil {
		log.Fatal(err)
	}
	c := once.Call{ID: idemkv.ID{Tenant: msg.Account, Endpoint: "ledger.credit", Key: "msg-0001"}, Fingerprint: fp.Bytes}
	apply := func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		key := []byte("balance/" + msg.Account)
		balance := 0
		b, err := x.Effects.Get(key)
		switch {
		case err == nil:
			if balance, err = strconv.Atoi(string(b)); err != nil {
				return idemkv.Result{}, err
			}
		case !errors.Is(err, idemkv.ErrNotFound):
			return idemkv.Result{}, err
		}
		balance += msg.Amount
		nb := []byte(strconv.Itoa(balance))
		return idemkv.Result{Status: 200, Body: nb}, x.Effects.Set(key, nb)
	}

	for range 2 { // the message is delivered twice
		out, err := once.Do(context.Background(), store, c, apply)
		fmt.Println(string(out.Result.Body), out.Replayed, err)
	}
	// Output:
	// 5000 false <nil>
	// 5000 true <nil>
}

// A remote call that times out may have happened: its key becomes
// uncertain, and a retry does not send it again but waits for a
// reconciler.
func ExampleDo_remote() {
	dir, err := os.MkdirTemp("", "once-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := engine.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	fp, err := fingerprint.ComputePayload(fingerprint.Payload{Kind: "psp.charge", Body: []byte(`{"amount":5000}`)}, nil)
	if err != nil {
		log.Fatal(err)
	}
	c := once.Call{ID: idemkv.ID{Tenant: "acct_42", Endpoint: "psp.charge", Key: "order-17"},
		Fingerprint: fp.Bytes, Mode: idemkv.ModeRemote}
	sent := 0
	charge := func(ctx context.Context, x *once.Exec) (idemkv.Result, error) {
		sent++ // would send x.Lease.OperationID.StepKey("charge") as the provider's idempotency key
		return idemkv.Result{}, errors.New("psp: read timeout")
	}

	_, err = once.Do(context.Background(), store, c, charge)
	fmt.Println(errors.Is(err, once.ErrUncertain))
	_, err = once.Do(context.Background(), store, c, charge)
	fmt.Println(errors.Is(err, once.ErrReconciling), sent)
	// Output:
	// true
	// true 1
}
