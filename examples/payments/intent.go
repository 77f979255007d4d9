package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
)

// A payment's intent: what the payment is, recorded before it is charged,
// so that whoever settles it without the request (an operator who learnt
// that it was charged while the processor could not say) can still write
// its row. It is written in the transaction that holds the payment's
// amount (begin), keyed by the operation like the hold, and deleted with
// the hold by whatever settles the payment: its row's commit (writer) or
// a give-back (giveBack).

// intent is what the payment row needs and the request alone knows.
type intent struct {
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description,omitempty"`
}

// Data key: "intent/" + len(tenant) + tenant + operation id.
func intentKey(tenant string, opID idemkv.OperationID) []byte {
	return scoped("intent/", tenant, opID.String())
}

// errPaid: the payment the operation makes is already stored (see begin).
var errPaid = errors.New("payments: the operation's payment is already stored")

// begin runs before the charge, in one transaction: it records the
// payment's intent and, under an account limit, holds its amount
// (limit.go). If the operation's payment is already stored it writes
// nothing and returns it with errPaid: the same request sent again once
// its record expired (the operation id, and so the payment id, derive
// from the request), or an attempt that lost its lease while another
// finished, which must not hold again.
//
// An attempt whose operation was given back under its lease's token or a
// later one (giveBack: its own release, or the resolution of its record
// as not charged while it stalled) is refused with errGivenBack: its hold
// would stand with no attempt left to give it back.
func (s *Service) begin(ctx context.Context, tenant string, opID idemkv.OperationID, token uint64, in intent) (paid stored, err error) {
	err = s.cfg.Store.Update(ctx, func(fx idemkv.Effects) error {
		row, err := fx.Get(paymentKey(tenant, paymentID(opID)))
		switch {
		case err == nil:
			if err := json.Unmarshal(row, &paid); err != nil {
				return fmt.Errorf("payments: payment row of operation %s: %w", opID, err)
			}
			return errPaid
		case !errors.Is(err, idemkv.ErrNotFound):
			return err
		}
		if s.cfg.AccountLimit != 0 {
			given, _, err := readAmount(fx, givenKey(tenant, opID))
			if err != nil {
				return err
			}
			if given >= token {
				return errGivenBack
			}
		}
		v, _ := json.Marshal(in)
		if err := fx.Set(intentKey(tenant, opID), v); err != nil {
			return err
		}
		return s.hold(fx, tenant, opID, in.Amount)
	})
	return paid, err
}

// readIntent returns the intent of the operation opID; found is false
// for a payment that began before intents were kept.
func (s *Service) readIntent(ctx context.Context, tenant string, opID idemkv.OperationID) (in intent, found bool, err error) {
	v, err := s.cfg.Store.GetData(ctx, intentKey(tenant, opID))
	switch {
	case errors.Is(err, idemkv.ErrNotFound):
		return in, false, nil
	case err != nil:
		return in, false, err
	}
	if err := json.Unmarshal(v, &in); err != nil {
		return in, false, fmt.Errorf("payments: intent of operation %s: %w", opID, err)
	}
	return in, true, nil
}

// giveBack undoes begin for a payment that provably was not charged: it
// gives the hold back (unhold) and deletes the intent, and under an
// account limit notes token, the lease token of the attempt (or of the
// record resolved), so that an attempt of that lease that stalled before
// its begin holds nothing when it wakes (the note goes when the
// operation's payment is stored: its row fences stale attempts then). It
// commits only in a fenced commit: an attempt's release or stored
// outcome, or a record's resolution.
func (s *Service) giveBack(tenant string, opID idemkv.OperationID, token uint64) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		if err := unhold(tenant, opID)(fx); err != nil {
			return err
		}
		if s.cfg.AccountLimit == 0 {
			return fx.Delete(intentKey(tenant, opID))
		}
		given, _, err := readAmount(fx, givenKey(tenant, opID))
		if err != nil {
			return err
		}
		if token > given {
			if err := writeAmount(fx, givenKey(tenant, opID), token); err != nil {
				return err
			}
		}
		return fx.Delete(intentKey(tenant, opID))
	}
}

// givenKey, "given/" + len(tenant) + tenant + operation id, holds the
// highest lease token under which the operation's hold was given back
// (big-endian uint64): an attempt holds only under a later one.
func givenKey(tenant string, opID idemkv.OperationID) []byte {
	return scoped("given/", tenant, opID.String())
}

// errGivenBack refuses the hold of an attempt whose operation was given
// back under its lease or a later one: the attempt has lost its lease.
var errGivenBack = fmt.Errorf("%w: the payment was given back under this attempt's lease", idemkv.ErrFenced)
