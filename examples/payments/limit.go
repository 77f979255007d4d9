package payments

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
)

// Account limits (Config.AccountLimit): the most an account's payments
// may charge in all. A payment holds its amount before it charges, in a
// transaction that reads the account's total and writes it back raised:
// two payments racing for the last of an account's limit read the same
// total, and the store's commit-time check makes the second run again on
// the first's total, so they never both pass. The hold, keyed by the
// payment's operation, is converted when the payment is stored, and
// given back when the charge provably did not happen (declined, refused
// before charging, reconciled or settled as not applied). A takeover of
// a payment finds its hold already there and does not hold twice.
//
// Every conversion and give-back commits with the attempt's outcome or
// release, or with the record's resolution, fenced on its token
// (httpidem.Op.Apply, httpidem.Op.Release, reconcile.Answer.Apply): an
// attempt that has lost its lease changes nothing, so it cannot give
// back a hold that the attempt which took the key over still counts on.
//
// Making the hold is not fenced: it is a plain transaction (Store.Update,
// with the payment's intent: begin, in intent.go) right after the claim.
// An attempt that loses its lease before that commits still makes it,
// keyed by the operation, and the hold stays with the operation: the
// next attempt of it (the retry that took the key over, a retry after a
// release, whose store derives the same operation id from the request,
// the reconciler, an operator) finds it and converts it or gives it
// back, and never holds twice. Cases with no next attempt are refused.
// If the operation was charged and stored meanwhile, the transaction
// finds its payment's row and holds nothing. If it was given back
// meanwhile (released, refused by the limit, declined, or its record
// settled as not charged), the give-back noted the lease token it was
// made under ("given/" + len(tenant) + tenant + operation id, kept until
// the operation's payment is stored), and an attempt whose token is not
// later holds nothing (errGivenBack).

// errOverLimit refuses a payment the account's limit cannot take.
var errOverLimit = errors.New("the payment would take the account over its limit")

// Data keys: "spent/" + len(tenant) + tenant holds the account's total
// charged or held (big-endian uint64, minor units); "hold/" + len(tenant)
// + tenant + operation id holds one payment's held amount.
func spentKey(tenant string) []byte { return scoped("spent/", tenant, "") }

func holdKey(tenant string, opID idemkv.OperationID) []byte {
	return scoped("hold/", tenant, opID.String())
}

func scoped(prefix, tenant, id string) []byte {
	k := make([]byte, 0, len(prefix)+1+len(tenant)+len(id))
	k = append(k, prefix...)
	k = append(k, byte(len(tenant)))
	return append(append(k, tenant...), id...)
}

// readAmount reads a uint64 through fx; absent is 0.
func readAmount(fx idemkv.Effects, key []byte) (uint64, bool, error) {
	v, err := fx.Get(key)
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case len(v) != 8:
		return 0, false, fmt.Errorf("payments: %q holds %d bytes, want 8", key, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

func writeAmount(fx idemkv.Effects, key []byte, n uint64) error {
	return fx.Set(key, binary.BigEndian.AppendUint64(nil, n))
}

// hold reserves amount of tenant's limit for the operation opID through
// fx, unless it already holds it; errOverLimit if the limit cannot take
// it. Without a limit it does nothing. The caller's transaction is begin
// (intent.go).
func (s *Service) hold(fx idemkv.Effects, tenant string, opID idemkv.OperationID, amount int64) error {
	if s.cfg.AccountLimit == 0 {
		return nil
	}
	if _, held, err := readAmount(fx, holdKey(tenant, opID)); err != nil || held {
		return err
	}
	spent, _, err := readAmount(fx, spentKey(tenant))
	if err != nil {
		return err
	}
	if spent+uint64(amount) > uint64(s.cfg.AccountLimit) {
		return errOverLimit
	}
	if err := writeAmount(fx, holdKey(tenant, opID), uint64(amount)); err != nil {
		return err
	}
	return writeAmount(fx, spentKey(tenant), spent+uint64(amount))
}

// unhold gives back the hold of opID, if there is one: the charge did
// not happen.
func unhold(tenant string, opID idemkv.OperationID) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		amount, held, err := readAmount(fx, holdKey(tenant, opID))
		if err != nil || !held {
			return err
		}
		spent, _, err := readAmount(fx, spentKey(tenant))
		if err != nil {
			return err
		}
		if err := fx.Delete(holdKey(tenant, opID)); err != nil {
			return err
		}
		return writeAmount(fx, spentKey(tenant), spent-min(spent, amount))
	}
}

// dropHold converts the hold of opID, if there is one, without knowing
// the payment's amount: the hold stays counted in the total, as charged.
func dropHold(tenant string, opID idemkv.OperationID) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		if _, held, err := readAmount(fx, holdKey(tenant, opID)); err != nil || !held {
			return err
		}
		return fx.Delete(holdKey(tenant, opID))
	}
}

// settleHold converts the hold of the payment p, made by opID, now that
// it is charged; a payment that held nothing (made while no limit was
// set) is added to the total, so the total counts every payment.
func (s *Service) settleHold(fx idemkv.Effects, p *stored, opID idemkv.OperationID) error {
	if s.cfg.AccountLimit == 0 {
		return nil
	}
	_, held, err := readAmount(fx, holdKey(p.Tenant, opID))
	if err != nil {
		return err
	}
	if held {
		return fx.Delete(holdKey(p.Tenant, opID))
	}
	spent, _, err := readAmount(fx, spentKey(p.Tenant))
	if err != nil {
		return err
	}
	return writeAmount(fx, spentKey(p.Tenant), spent+uint64(p.Amount))
}

// account answers GET /v1/account: the caller's limit and what its
// payments have charged or hold.
func (s *Service) account(w http.ResponseWriter, r *http.Request) {
	tenant, err := s.tenantOf(r)
	if err != nil {
		w.Header().Set("WWW-Authenticate", challenge)
		httpidem.WriteProblem(w, httpidem.ProblemUnauthenticated, http.StatusUnauthorized, err.Error(), 0)
		return
	}
	var spent uint64
	if v, err := s.cfg.Store.GetData(r.Context(), spentKey(tenant)); err == nil && len(v) == 8 {
		spent = binary.BigEndian.Uint64(v)
	} else if err != nil && !errors.Is(err, idemkv.ErrNotFound) {
		httpidem.WriteProblem(w, "internal", http.StatusInternalServerError, err.Error(), 0)
		return
	}
	writeJSON(w, http.StatusOK, Account{Account: tenant, Limit: s.cfg.AccountLimit, Spent: int64(spent)})
}

// Account is the body of GET /v1/account.
type Account struct {
	Account string `json:"account"`
	// Limit is Config.AccountLimit; 0 means none.
	Limit int64 `json:"limit"`
	// Spent is what the account's payments have charged or hold, counted
	// only while a limit is set.
	Spent int64 `json:"spent"`
}
