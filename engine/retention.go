package engine

import (
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/engine/internal/record"
	"github.com/idemkv/idemkv/ttl"
)

// Retention returns how long a record of the retention class named class
// ("" or ttl.DefaultClass: the default class) is kept after it completes.
// It fails with an error wrapping idemkv.ErrInvalidArgument for a class
// the engine is not configured with.
func (e *Engine) Retention(class string) (time.Duration, error) {
	c, err := e.claimClass(class)
	if err != nil {
		return 0, err
	}
	return e.window(c), nil
}

// expiresAt is the end of the retention window of class for a record
// written at now, in whole seconds as the codec stores it, so that a
// record held in memory (a slot, the replay cache) expires exactly when
// its stored copy does.
func (e *Engine) expiresAt(now time.Time, class string) time.Time {
	return record.Seconds(now.Add(e.window(class)))
}

// window is the retention window of class ("" is the default class). A
// class no longer configured (a stored record outliving a configuration
// change) gets the longest window: keeping a record too long costs space,
// dropping it too early could run an operation twice.
func (e *Engine) window(class string) time.Duration { return e.opts.window(class) }

func (o *Options) window(class string) time.Duration {
	if class == "" || class == ttl.DefaultClass {
		return o.Retention
	}
	if w, ok := o.RetentionClasses[class]; ok {
		return w
	}
	return o.RetentionClasses.Longest()
}

// claimClass checks that a claim's retention class is configured and
// returns the name to store: "" for the default class.
func (e *Engine) claimClass(name string) (string, error) {
	if name == "" || name == ttl.DefaultClass {
		return "", nil
	}
	if _, err := e.opts.RetentionClasses.Lookup(name); err != nil {
		return "", fmt.Errorf("%w: %w", idemkv.ErrInvalidArgument, err)
	}
	return name, nil
}
