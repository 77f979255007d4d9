package natsjs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicateWindow is EnsureStream's duplicate window when it is
// given 0: the same as the server's own default.
const DefaultDuplicateWindow = 2 * time.Minute

// EnsureStream makes sure that stream name exists, is stored on disk
// (file storage), captures subjects, and deduplicates on Nats-Msg-Id over
// duplicates (0 means DefaultDuplicateWindow), and returns it.
//
// A missing stream is created with those settings and the server's
// defaults otherwise (one replica, limits retention, no limits). An
// existing one keeps its other settings, its other subjects, and a
// longer window an operator gave it; it is updated only if it captures
// none of subjects (a subject is there if one of the stream's matches it,
// through wildcards; one that matches some of the stream's replaces them,
// as the server refuses overlapping subjects) or has a shorter window.
// Subjects that overlap without either covering the other
// (payments.*.eu, payments.created.*) cannot share a stream: the server's
// refusal is returned. A stream
// kept in memory is an error: storage cannot be changed in place, and a
// memory stream loses the events the relay has already removed from the
// outbox.
//
// The window is how long after storing a message the stream still
// recognizes its id: the relay's republish of an event is absorbed only if
// it comes within the window of the first copy that was stored. A relay
// that is down for longer than the window, between a publish that landed
// and its acknowledgement in the outbox, publishes a second copy. A longer
// window costs server memory (one entry per message in the window).
func EnsureStream(ctx context.Context, js jetstream.JetStream, name string, subjects []string, duplicates time.Duration) (jetstream.Stream, error) {
	if duplicates == 0 {
		duplicates = DefaultDuplicateWindow
	}
	if duplicates < 0 {
		return nil, fmt.Errorf("natsjs: stream %q: negative duplicate window %v", name, duplicates)
	}
	if len(subjects) == 0 {
		return nil, fmt.Errorf("natsjs: stream %q: no subjects", name)
	}
	// Two attempts: a create can lose a race with another process's, and
	// then the stream exists and is updated instead.
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = js.CreateStream(ctx, jetstream.StreamConfig{
				Name:       name,
				Subjects:   subjects,
				Storage:    jetstream.FileStorage,
				Duplicates: duplicates,
			})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("natsjs: create stream %q: %w", name, err)
			}
			return s, nil
		}
		if err != nil {
			return nil, fmt.Errorf("natsjs: stream %q: %w", name, err)
		}
		return updateStream(ctx, js, s, subjects, duplicates)
	}
}

// updateStream adds subjects to an existing file-storage stream and
// lengthens its duplicate window to duplicates, changing nothing else.
func updateStream(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, subjects []string, duplicates time.Duration) (jetstream.Stream, error) {
	cfg := s.CachedInfo().Config
	if cfg.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("natsjs: stream %q has %v storage, not file; recreate it with file storage", cfg.Name, cfg.Storage)
	}
	changed := cfg.Duplicates < duplicates
	cfg.Duplicates = max(cfg.Duplicates, duplicates)
	cfg.Subjects = slices.Clone(cfg.Subjects) // not the cached info's
	for _, subj := range subjects {
		if slices.ContainsFunc(cfg.Subjects, func(have string) bool { return covers(have, subj) }) {
			continue
		}
		// The server refuses overlapping subjects in one stream: those
		// the new one covers go, as it captures them.
		cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(have string) bool { return covers(subj, have) })
		cfg.Subjects = append(cfg.Subjects, subj)
		changed = true
	}
	if !changed {
		return s, nil
	}
	s, err := js.UpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("natsjs: update stream %q: %w", cfg.Name, err)
	}
	return s, nil
}

// covers reports whether every subject that subject b matches is one
// that subject a matches, by NATS's rules: tokens split by '.', '*' one
// token, '>' one or more as the last token.
func covers(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i, tok := range at {
		switch {
		case tok == ">":
			return i < len(bt) // one or more tokens of b left
		case i >= len(bt):
			return false
		case tok == "*":
			if bt[i] == ">" {
				return false
			}
		case tok != bt[i]:
			return false
		}
	}
	return len(at) == len(bt)
}
