package fingerprint_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/fingerprint"
)

// benchBody returns a payment-like JSON object of exactly size bytes (at
// least about 300): compact, members not in canonical order, a few escapes
// and non-integer numbers, and as many line items as fit.
func benchBody(size int) []byte {
	head := `{"currency":"EUR","amount":129.95,"customer":{"name":"Zoë Example","id":"cus_8f3a","email":"zoe@example.com",` +
		`"address":{"line1":"1 Rue de l\u2019Exemple","city":"Paris","postal_code":"75001","country":"FR"}},` +
		`"description":"Order #1234 \"express\"","metadata":{"order_id":"ord_1234","channel":"web"},"items":[`
	var b strings.Builder
	b.WriteString(head)
	const tail = `],"note":""}`
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"unit_price":%d.%02d,"sku":"sku_%05d","qty":%d,"name":"Widget n\u00b0%d","tax_rate":0.2}`, i%100, i%97, i, 1+i%5, i)
		if i > 0 {
			item = "," + item
		}
		if b.Len()+len(item)+len(tail) > size {
			break
		}
		b.WriteString(item)
	}
	b.WriteString(`],"note":"`)
	b.WriteString(strings.Repeat("n", size-b.Len()-2))
	b.WriteString(`"}`)
	if b.Len() != size {
		panic(fmt.Sprintf("bench body is %d bytes, want %d", b.Len(), size))
	}
	return []byte(b.String())
}

func benchRequest(size int) fingerprint.Request {
	return fingerprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/payments",
		Header: map[string][]string{"Content-Type": {"application/json"}, "Api-Version": {"2026-01-01"}},
		Body:   benchBody(size),
	}
}

// BenchmarkCompute measures fingerprints per second (fp/s) and body
// throughput (MB/s) for 1 KiB and 64 KiB JSON bodies in each mode.
func BenchmarkCompute(b *testing.B) {
	modes := []struct {
		name string
		opts *fingerprint.Options
	}{
		{"json", &fingerprint.Options{Headers: []string{"Api-Version"}}},
		{"fields", &fingerprint.Options{Mode: fingerprint.ModeFields, Fields: []string{"/amount", "/currency", "/customer/id"}}},
		{"raw", &fingerprint.Options{Mode: fingerprint.ModeRaw}},
	}
	for _, size := range []int{1 << 10, 64 << 10} {
		req := benchRequest(size)
		for _, m := range modes {
			b.Run(fmt.Sprintf("%s/%dKiB", m.name, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(req.Body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := fingerprint.Compute(req, m.opts); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "fp/s")
			})
		}
	}
}

// BenchmarkDiagnostics measures what Options.Diagnostics costs: the time,
// and the bytes per record a caller stores (diag-B/record) beside the
// 9-byte fingerprint, for a typical small payment and the benchmark
// bodies.
func BenchmarkDiagnostics(b *testing.B) {
	small := fingerprint.Request{
		Tenant: "acct_42", Method: "POST", Route: "/v1/payments",
		Body: []byte(`{"amount":5000,"currency":"USD","card":"tok_123"}`),
	}
	for _, tc := range []struct {
		name string
		req  fingerprint.Request
	}{
		{"payment", small},
		{"1KiB", benchRequest(1 << 10)},
		{"64KiB", benchRequest(64 << 10)},
	} {
		opts := &fingerprint.Options{Diagnostics: true}
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.req.Body)))
			b.ReportAllocs()
			var fp fingerprint.FP
			for b.Loop() {
				var err error
				if fp, err = fingerprint.Compute(tc.req, opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(fp.Bytes)), "fp-B/record")
			b.ReportMetric(float64(len(fp.Diagnostics)), "diag-B/record")
		})
	}
}

// BenchmarkCanonical measures the JCS canonicalizer alone.
func BenchmarkCanonical(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		body := benchBody(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fingerprint.Canonical(body, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestBenchBody(t *testing.T) {
	for _, size := range []int{1 << 10, 64 << 10} {
		if _, err := fingerprint.Canonical(benchBody(size), nil); err != nil {
			t.Fatal(err)
		}
	}
}
