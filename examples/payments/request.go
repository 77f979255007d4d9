package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"slices"
	"strconv"
)

// Reading and validating the body of POST /v1/payments.

// paymentRequest is the body of POST /v1/payments. Pointers tell an absent
// field from a zero one.
type paymentRequest struct {
	Amount   *json.Number `json:"amount"`
	Currency *string      `json:"currency"`
	Card     *string      `json:"card"`
	// Description is optional.
	Description string `json:"description"`
}

// maxDescription bounds Payment.Description, in bytes.
const maxDescription = 500

// validate checks a payment request and returns its amount in minor units.
func validate(req paymentRequest) (int64, []string) {
	var problems []string
	var amount int64
	if req.Amount == nil {
		problems = append(problems, "amount is required")
	} else if n, ok := wholeNumber(req.Amount.String()); !ok {
		problems = append(problems, "amount must be a whole number of minor units (cents)")
	} else if n <= 0 {
		problems = append(problems, "amount must be positive")
	} else {
		amount = n
	}
	switch {
	case req.Currency == nil:
		problems = append(problems, "currency is required")
	case !isCurrency(*req.Currency):
		problems = append(problems, "currency must be a three-letter upper-case ISO 4217 code")
	}
	if req.Card == nil || *req.Card == "" {
		problems = append(problems, "card is required")
	}
	if len(req.Description) > maxDescription {
		problems = append(problems, fmt.Sprintf("description must be at most %d bytes", maxDescription))
	}
	return amount, problems
}

// decodePayment reads a payment request as the fingerprint reads it:
// member names match exactly (Go's decoder would take "AMOUNT" for
// "amount"), and a member the request does not define, or a value of the
// wrong JSON type, is a problem (422), not ignored or converted. err is
// for a body that is not a JSON object (400). Messages never show Go's
// type names.
func decodePayment(body io.Reader) (req paymentRequest, problems []string, err error) {
	var members map[string]json.RawMessage
	dec := json.NewDecoder(body)
	dec.UseNumber()
	if dec.Decode(&members) != nil || members == nil {
		return req, nil, errors.New("the body must be a JSON object")
	}
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		raw := members[name]
		if string(raw) == "null" {
			continue // as if absent
		}
		switch name {
		case "amount":
			if raw[0] == '"' || json.Unmarshal(raw, &req.Amount) != nil {
				problems = append(problems, "amount must be a JSON number")
			}
		case "currency", "card", "description":
			var v string
			if json.Unmarshal(raw, &v) != nil {
				problems = append(problems, name+" must be a JSON string")
				continue
			}
			switch name {
			case "currency":
				req.Currency = &v
			case "card":
				req.Card = &v
			default:
				req.Description = v
			}
		default:
			problems = append(problems, fmt.Sprintf("unknown member %q (members: amount, currency, card, description)", name))
		}
	}
	return req, problems, nil
}

// wholeNumber reads a JSON number as an exact integer: 5000 and 5000.0 and
// 5e3 are 5000, as their fingerprints are the same; 1.5 is not an integer.
func wholeNumber(s string) (int64, bool) {
	if f, err := strconv.ParseFloat(s, 64); err != nil || math.Abs(f) > math.MaxInt64 {
		return 0, false // checked first: 1e300 is cheap to refuse, costly to expand
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok || !r.IsInt() || !r.Num().IsInt64() {
		return 0, false
	}
	return r.Num().Int64(), true
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
