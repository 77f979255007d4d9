package payments

import (
	"encoding/json"
	"time"

	"github.com/idemkv/idemkv"
)

// What a payment writes, in the commit of its outcome (from the handler
// or from the reconciler alike): its row, its place in its account's
// listing, its hold's conversion (limit.go) and, with Config.Events, its
// event.

// payment is the payment made by the operation opID with the charge ch:
// its id derives from the operation id, as the charge's key does, so the
// handler and a reconciler that finds the charge make the same payment.
func (s *Service) payment(tenant string, opID idemkv.OperationID, ch Charge) stored {
	return stored{Tenant: tenant, Payment: Payment{
		ID: "pay_" + opID.StepKey("payment")[:24], Amount: ch.Amount, Currency: ch.Currency, Description: ch.Description,
		Status: "succeeded", Charge: ch.ID, Created: s.cfg.Clock.Now().UTC(),
	}}
}

// TopicCreated is the topic of the event a payment emits when
// Config.Events is set.
const TopicCreated = "payments.created"

// CreatedEvent is the payload of a payments.created event (JSON); the
// event's key is the account.
type CreatedEvent struct {
	Payment string `json:"payment"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
	// Currency is the ISO 4217 code, upper case.
	Currency string    `json:"currency"`
	Charge   string    `json:"charge"`
	Created  time.Time `json:"created"`
}

// writer returns the apply function that writes p's row, its place in
// its tenant's listing and, with Config.Events, its event.
func (s *Service) writer(p stored, opID idemkv.OperationID) func(idemkv.Effects) error {
	return func(fx idemkv.Effects) error {
		row, _ := json.Marshal(p)
		if err := fx.Set(paymentKey(p.Tenant, p.ID), row); err != nil {
			return err
		}
		if err := fx.Set(indexKey(p.Tenant, p.Created, p.ID), []byte(p.ID)); err != nil {
			return err
		}
		if err := s.settleHold(fx, &p, opID); err != nil {
			return err
		}
		if !s.cfg.Events {
			return nil
		}
		ev, _ := json.Marshal(CreatedEvent{Payment: p.ID, Account: p.Tenant, Amount: p.Amount, Currency: p.Currency, Charge: p.Charge, Created: p.Created})
		return fx.Emit(idemkv.Event{Topic: TopicCreated, Key: p.Tenant, Payload: ev})
	}
}
