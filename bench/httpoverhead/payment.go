package httpoverhead

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv/bench"
	"github.com/idemkv/idemkv/httpidem"
)

// httpConn is one client's keep-alive connection to one handler. A
// request is written and its response read on the client's goroutine,
// without net/http's client transport and the two goroutines it runs per
// connection: on two cores shared with the servers, the load generator
// should spend as little of them, and add as few scheduling hand-offs to
// each request, as it can. The request is what a payments client sends:
// a bearer token, an Idempotency-Key as a Structured Field string and a
// JSON body.
type httpConn struct {
	c    net.Conn
	r    *bufio.Reader
	host string
	buf  []byte
}

// httpRequestTimeout bounds one request; a handler that stalls this long
// fails the run rather than hang it.
const httpRequestTimeout = 30 * time.Second

func dialHTTP(addr string) (*httpConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &httpConn{c: c, r: bufio.NewReaderSize(c, 4096), host: addr}, nil
}

// pay sends one new payment and checks that it was created.
func (hc *httpConn) pay(stream, i uint64, tenants int) error {
	id := bench.Key(stream, i, tenants)
	var body [96]byte
	bb := append(body[:0], `{"amount":`...)
	bb = strconv.AppendUint(bb, 1+i%100000, 10)
	bb = append(bb, `,"currency":"USD","card":"tok_visa"}`...)
	b := append(hc.buf[:0], "POST /v1/payments HTTP/1.1\r\nHost: "...)
	b = append(b, hc.host...)
	b = append(b, "\r\nAuthorization: Bearer "...)
	b = append(b, id.Tenant...)
	b = append(b, "\r\n"+httpidem.HeaderKey+": \""...)
	b = append(b, id.Key...)
	b = append(b, "\"\r\nContent-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(bb)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, bb...)
	hc.buf = b
	if err := hc.c.SetDeadline(time.Now().Add(httpRequestTimeout)); err != nil {
		return err
	}
	if _, err := hc.c.Write(b); err != nil {
		return err
	}
	resp, err := http.ReadResponse(hc.r, nil)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusCreated:
		return fmt.Errorf("status %d: %s", resp.StatusCode, got)
	case resp.Close:
		return errors.New("the server closed the connection")
	}
	return nil
}

// tenant is the middleware's tenant function: the bearer token.
func tenant(r *http.Request) (string, error) {
	t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || t == "" {
		return "", errors.New("no bearer token")
	}
	return t, nil
}

// paymentHandler is the handler both targets serve: it checks the
// principal and the JSON body, makes a payment row and commits it with
// commit, and answers 201 with the payment.
func paymentHandler(commit func(r *http.Request, key, row []byte) error) http.HandlerFunc {
	var seq atomic.Uint64
	return func(w http.ResponseWriter, r *http.Request) {
		t, err := tenant(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var req struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
			Card     string `json:"card"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 || req.Currency == "" || req.Card == "" {
			http.Error(w, "bad payment", http.StatusUnprocessableEntity)
			return
		}
		id := "pay_" + strconv.FormatUint(seq.Add(1), 36)
		row, _ := json.Marshal(map[string]any{"id": id, "tenant": t, "amount": req.Amount, "currency": req.Currency, "status": "succeeded"})
		if err := commit(r, []byte("pay/"+id), row); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/payments/"+id)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"amount":%d,"currency":%q,"status":"succeeded"}`, id, req.Amount, req.Currency)
	}
}
