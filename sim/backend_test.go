package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/examples/payments"
	"github.com/idemkv/idemkv/pgstore"
)

// A backend is the store the service runs on, behind the store contract:
// the real engine or the real PostgreSQL store. A crash of a service
// process leaves the store as a crash leaves it; the next life opens it
// again.
type backend interface {
	name() string
	// open opens service svc's store for the life p, whose clock it
	// runs on.
	open(p *Proc, svc int) (payments.Store, error)
	// crash closes st, the store of a life that crashed, leaving behind
	// what a crash leaves.
	crash(svc int, st payments.Store)
	// sweep drops expired records.
	sweep(ctx context.Context, st payments.Store) error
	// services is how many processes share the store.
	services() int
}

// engineBackend is the engine on Pebble over a crashable in-memory
// filesystem: a crash keeps exactly what was synced (CrashClone), which
// is what a power loss or kill -9 keeps of a real disk. One process owns
// it at a time.
type engineBackend struct {
	pw  *payWorld
	mem *vfs.MemFS
}

func (b *engineBackend) name() string  { return "engine" }
func (b *engineBackend) services() int { return 1 }

func (b *engineBackend) open(p *Proc, _ int) (payments.Store, error) {
	if b.mem == nil {
		b.mem = vfs.NewCrashableMem()
		if d := b.pw.prm.storeAhead; d > 0 {
			// Closed last on a host whose clock ran d ahead: the store's
			// time starts from that mark.
			e, err := b.openOn(aheadClock{p, d})
			if err != nil {
				return nil, err
			}
			if err := e.Close(); err != nil {
				return nil, err
			}
		}
	}
	return b.openOn(p)
}

func (b *engineBackend) openOn(clock idemkv.SteadyClock) (*engine.Engine, error) {
	return engine.Open("store", &engine.Options{
		FS: b.mem, Clock: clock, Rand: rand.NewChaCha8(seed32(b.pw.w.Rand())),
		Lease: b.pw.prm.lease, Retention: b.pw.prm.retention, NoBackgroundSweep: true,
		Logger: quietPebble{}, MinFreeDisk: -1,
		// A run holds a few dozen records: small caches open fast.
		CacheSize: 1 << 20, MemTableSize: 1 << 20, ReplayCacheSize: 1 << 20, Shards: 16,
	})
}

// aheadClock is p's clock as a host whose clock runs d ahead reads it.
type aheadClock struct {
	p *Proc
	d time.Duration
}

func (c aheadClock) Now() time.Time { return c.p.Now().Add(c.d) }
func (c aheadClock) Read() (time.Time, time.Duration) {
	w, at := c.p.Read()
	return w.Add(c.d), at
}

func (b *engineBackend) crash(_ int, st payments.Store) {
	b.mem = b.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	_ = st.Close() // its writes go to the filesystem the crash left behind
}

func (b *engineBackend) sweep(ctx context.Context, st payments.Store) error {
	_, err := st.(*engine.Engine).Sweep(ctx)
	return err
}

// pgBackend is the PostgreSQL store, shared by every service process: a
// crash of one closes its connections, and the database keeps what it
// committed.
type pgBackend struct {
	pw  *payWorld
	dsn string
	n   int
}

func (b *pgBackend) name() string  { return "postgres" }
func (b *pgBackend) services() int { return b.n }

func (b *pgBackend) open(p *Proc, _ int) (payments.Store, error) {
	return pgstore.Open(context.Background(), b.dsn, &pgstore.Options{
		Clock: p, Lease: b.pw.prm.lease, Retention: b.pw.prm.retention,
		NoBackgroundSweep: true, NoListen: true, MaxConns: 4,
	})
}

func (b *pgBackend) crash(_ int, st payments.Store) { _ = st.Close() }

func (b *pgBackend) sweep(ctx context.Context, st payments.Store) error {
	_, err := st.(*pgstore.Store).Sweep(ctx)
	return err
}

// quietPebble is a pebble.Logger that says nothing.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

func seed32(r *rand.Rand) (s [32]byte) {
	for i := range s {
		s[i] = byte(r.Uint32())
	}
	return s
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed>>1|1)) }
