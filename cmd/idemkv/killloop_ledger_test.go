package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/ledger"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/inbox"
	"github.com/idemkv/idemkv/internal/tier"
	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natstest"
	"github.com/idemkv/idemkv/outbox"
	"github.com/idemkv/idemkv/ttl"
)

// ledgerKillCyclesEnv sets TestLedgerKillLoop's kill cycles (default 5);
// IDEMKV_KILL_SEED its seed, as for TestServeKillLoop.
const ledgerKillCyclesEnv = "IDEMKV_LEDGER_KILL_CYCLES"

// TestLedgerKillLoop is the consumer's kill loop: "idemkv ledger" as a
// child process consumes a stream of payments.created events from a real
// JetStream server in this process (some events published twice under
// one id beyond the stream's reach, as a relay restarted late would), and
// is killed with SIGKILL at random moments while it applies them. After
// every kill, its store holds exactly the events up to its position,
// each applied once: the position never runs ahead of the effects, nor
// behind them. At the end, once it has caught up, its balances are
// exactly one application of every event in the stream.
func TestLedgerKillLoop(t *testing.T) {
	tier.Require(t, "starts and kills processes for several seconds")
	cycles, seed := killKnobs(t, ledgerKillCyclesEnv)
	rng := rand.New(rand.NewPCG(seed, 0x6c656467))
	ns := natstest.Start(t)
	nc := ns.Connect(t)
	pub, err := natsjs.New(nc, nil)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = natsjs.EnsureStream(ctx, pub.JetStream(), eventsStream, []string{"payments.>"}, time.Second)
	require.NoError(t, err)

	// The stream: 500 events a cycle over five accounts. One in ten is
	// published again later, with the same event id but another
	// Nats-Msg-Id, so that the stream keeps both copies, as it would of a
	// relay's republish past its duplicate window.
	accounts := []string{"acct_a", "acct_b", "acct_c", "acct_d", "acct_e"}
	type event struct {
		id      string
		account string
		amount  int64
	}
	var stream []event // by stream position - 1
	n := 500 * cycles
	for i := range n {
		ev := event{id: fmt.Sprintf("ev-%05d", i), account: accounts[rng.IntN(len(accounts))], amount: int64(1 + rng.IntN(1000))}
		stream = append(stream, ev)
		if rng.IntN(10) == 0 && i > 0 {
			stream = append(stream, stream[rng.IntN(len(stream)-1)])
		}
	}
	for i, ev := range stream {
		body, _ := json.Marshal(payments.CreatedEvent{Payment: "pay_" + ev.id, Account: ev.account, Amount: ev.amount, Currency: "USD"})
		m := nats.NewMsg(payments.TopicCreated)
		m.Data = body
		m.Header.Set(outbox.HeaderEventID, ev.id) // the id the ledger deduplicates on
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("publish-", i))
		_, err := pub.JetStream().PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	want := func(upTo int) map[string]int64 { // each event id applied once
		seen, sums := map[string]bool{}, map[string]int64{}
		for _, ev := range stream[:upTo] {
			if !seen[ev.id] {
				seen[ev.id] = true
				sums[ev.account] += ev.amount
			}
		}
		return sums
	}

	dir := t.TempDir()
	kills := 0
	for cycle := range cycles {
		child := startLedger(t, dir, ns.URL())
		<-time.NewTimer(time.Duration(10+rng.IntN(140)) * time.Millisecond).C
		require.NoError(t, child.Process.Kill())
		_ = child.Wait()
		kills++
		pos, got := readLedger(t, dir, accounts)
		require.LessOrEqual(t, pos, uint64(len(stream)))
		require.Equal(t, want(int(pos)), got, "cycle %d: balances at position %d", cycle, pos)
		t.Logf("cycle %d: killed at position %d of %d", cycle, pos, len(stream))
	}

	// Recovery: run to the end of the stream in this process.
	e, err := engine.Open(dir, &engine.Options{RetentionClasses: ttl.Classes{ledgerClass: time.Hour}})
	require.NoError(t, err)
	c, err := ledger.New(e, &inbox.Options{Retention: ledgerClass})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	last := uint64(len(stream))
	go func() {
		done <- natsjs.Consume(rctx, pub.JetStream(), eventsStream, c, ledger.Handle, &natsjs.ConsumeOptions{
			Processed: func(m inbox.Message, _ inbox.Outcome) {
				if m.Position == last {
					cancel()
				}
			}})
	}()
	if pos, err := c.Position(ctx); err == nil && pos == last {
		cancel()
	}
	<-done
	require.NoError(t, e.Close())
	pos, got := readLedger(t, dir, accounts)
	require.Equal(t, last, pos)
	require.Equal(t, want(len(stream)), got, "exactly one application of every event")
	requireCheckClean(t, dir, "at the end")
	t.Logf("%d kill cycles; %d messages of %d distinct events, each applied once", kills, len(stream), n)
}

// startLedger starts the test binary as "idemkv ledger" over dir and waits
// for its banner.
func startLedger(t *testing.T, dir, url string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "ledger", "--events", url, "--data", dir)
	cmd.Env = append(os.Environ(), "IDEMKV_TEST_AS_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = io.Discard
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "ledger consuming stream") {
			go io.Copy(io.Discard, stdout)
			return cmd
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	t.Fatalf("ledger did not start: %v", sc.Err())
	return nil
}

// readLedger reads the ledger's position and USD totals in dir.
func readLedger(t *testing.T, dir string, accounts []string) (uint64, map[string]int64) {
	var out, errOut strings.Builder
	require.Equal(t, exitOK, run(context.Background(), []string{"ledger", "--data", dir, "--balances", strings.Join(accounts, ",")}, &out, &errOut), errOut.String())
	var got struct {
		Position       uint64
		Currency, Unit string
		Balances       map[string]ledger.Balance
	}
	require.NoError(t, json.Unmarshal([]byte(out.String()), &got))
	require.Equal(t, [2]string{"USD", "cents"}, [2]string{got.Currency, got.Unit}, "what the totals count")
	sums := map[string]int64{}
	for a, b := range got.Balances {
		if b.Total != 0 {
			sums[a] = b.Total
		}
	}
	return got.Position, sums
}
