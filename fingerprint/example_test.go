package fingerprint_test

import (
	"errors"
	"fmt"

	"github.com/idemkv/idemkv/fingerprint"
)

func ExampleCompute() {
	opts := &fingerprint.Options{Headers: []string{"Api-Version"}}
	first := fingerprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/payments",
		Header: map[string][]string{"Api-Version": {"2026-01-01"}},
		Body:   []byte(`{"amount": 5000, "currency": "USD"}`),
	}
	retry := first
	retry.Body = []byte(`{"currency":"USD","amount":5e3}`)

	a, _ := fingerprint.Compute(first, opts)
	b, _ := fingerprint.Compute(retry, opts)
	fmt.Println(len(a.Bytes), a.String() == b.String())

	bad := first
	bad.Body = []byte(`{"amount": 5000, "amount": 6000}`)
	_, err := fingerprint.Compute(bad, opts)
	fmt.Println(errors.Is(err, fingerprint.ErrInvalidBody), err)
	// Output:
	// 9 true
	// true fingerprint: duplicate member name at offset 17: "amount"
}

func ExampleCanonical() {
	out, _ := fingerprint.Canonical([]byte(`{"b": [1.0, 1e21, 0.0000001], "a": "\u00e9\n"}`), nil)
	fmt.Println(string(out))
	// Output: {"a":"é\n","b":[1,1e+21,1e-7]}
}

func ExampleExplain() {
	opts := &fingerprint.Options{Diagnostics: true}
	first := fingerprint.Request{Tenant: "acct_42", Body: []byte(`{"amount":5000,"currency":"USD"}`)}
	stored, _ := fingerprint.Compute(first, opts)

	retry := first
	retry.Body = []byte(`{"amount":50000,"currency":"USD","note":"x"}`)
	ok, _ := fingerprint.Matches(stored.Bytes, retry, opts)
	diffs, _ := fingerprint.Explain(stored.Diagnostics, retry, opts)
	fmt.Println(ok, diffs)
	// Output: false [body /amount: changed body /note: added]
}
