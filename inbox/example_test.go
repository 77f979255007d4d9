package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/inbox"
)

// A consumer credits an account once per event, however often the event
// is delivered, and rejects a payload it can never apply.
func Example() {
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := engine.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	c, err := inbox.New("credits", store, nil)
	if err != nil {
		log.Fatal(err)
	}

	credit := func(_ context.Context, fx idemkv.Effects, msg inbox.Message) error {
		var ev struct {
			Account string `json:"account"`
			Amount  int    `json:"amount"`
		}
		if err := json.Unmarshal(msg.Data, &ev); err != nil || ev.Account == "" {
			return inbox.Reject(errors.New("not a credit"))
		}
		key := []byte("balance/" + ev.Account)
		balance := 0
		if b, err := fx.Get(key); err == nil {
			balance, _ = strconv.Atoi(string(b))
		} else if !errors.Is(err, idemkv.ErrNotFound) {
			return err
		}
		return fx.Set(key, []byte(strconv.Itoa(balance+ev.Amount)))
	}

	ctx := context.Background()
	for _, m := range []inbox.Message{
		{ID: "ev-1", Position: 1, Subject: "credits", Data: []byte(`{"account":"acct_42","amount":50}`)},
		{ID: "ev-1", Position: 1, Subject: "credits", Data: []byte(`{"account":"acct_42","amount":50}`)}, // redelivered
		{ID: "ev-2", Position: 2, Subject: "credits", Data: []byte(`{"amount":"lots"}`)},
		{ID: "ev-3", Position: 3, Subject: "credits", Data: []byte(`{"account":"acct_42","amount":25}`)},
	} {
		out, err := c.Process(ctx, m, credit)
		fmt.Println(m.ID, out.Applied(), out.Duplicate, out.Rejected, err)
	}
	b, _ := store.GetData(ctx, []byte("balance/acct_42"))
	pos, _ := c.Position(ctx)
	fmt.Println(string(b), pos)
	// Output:
	// ev-1 true false false <nil>
	// ev-1 false true false <nil>
	// ev-2 false false true <nil>
	// ev-3 true false false <nil>
	// 75 3
}
