package payments

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/httpidem"
)

// What a payment writes, in the commit of its outcome (from the handler,
// a reconciler's answer or an operator's settlement alike): its row, its
// place in its account's listing, its hold's conversion (limit.go), the
// deletion of its intent (intent.go) and, with Config.Events, its event.

// paymentID is the id of the payment the operation opID makes: it
// derives from the operation id, as the charge's key does, so the
// handler, a reconciler that finds the charge and an operator make the
// same payment.
func paymentID(opID idemkv.OperationID) string { return "pay_" + opID.StepKey("payment")[:24] }

// payment is the payment made by the operation opID with the charge ch.
func (s *Service) payment(tenant string, opID idemkv.OperationID, ch Charge) stored {
	return stored{Tenant: tenant, Payment: Payment{
		ID: paymentID(opID), Amount: ch.Amount, Currency: ch.Currency, Description: ch.Description,
		Status: "succeeded", Charge: ch.ID, Created: s.cfg.Clock.Now().UTC(),
	}}
}

// createdOutcome is the stored outcome of the payment id, as the handler's
// answer stores it (Route.PointerOnly): 201, its Location and its content
// type, and no body; replays rebuild the body from the row.
func createdOutcome(id string) idemkv.Result {
	pointer := "/v1/payments/" + id
	return httpidem.Outcome(http.StatusCreated, pointer,
		http.Header{"Content-Type": {"application/json"}, "Location": {pointer}}, nil)
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
// its tenant's listing, converts its hold, deletes its intent and its
// give-backs' note and, with Config.Events, emits its event.
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
		if err := fx.Delete(intentKey(p.Tenant, opID)); err != nil {
			return err
		}
		if s.cfg.AccountLimit != 0 { // the row fences stale attempts now
			if err := fx.Delete(givenKey(p.Tenant, opID)); err != nil {
				return err
			}
		}
		if !s.cfg.Events {
			return nil
		}
		ev, _ := json.Marshal(CreatedEvent{Payment: p.ID, Account: p.Tenant, Amount: p.Amount, Currency: p.Currency, Charge: p.Charge, Created: p.Created})
		return fx.Emit(idemkv.Event{Topic: TopicCreated, Key: p.Tenant, Payload: ev})
	}
}
