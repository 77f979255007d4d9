package events

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkv/idemkv/natsjs"
	"github.com/idemkv/idemkv/natsjs/natsembed"
)

// streamName is the JetStream stream the run publishes to.
const streamName = "EVENTS"

// duplicateWindow is the stream's duplicate window, the server's default.
const duplicateWindow = 2 * time.Minute

// broker is the run's JetStream server, in this process, and a publisher
// connected to it.
type broker struct {
	dir    string
	emb    *natsembed.Server
	pub    *natsjs.Publisher
	stream jetstream.Stream
}

// startBroker starts an embedded JetStream server with its store in dir
// (sync_always), connects a publisher, and creates the stream.
func startBroker(ctx context.Context, dir string) (*broker, error) {
	emb, err := natsembed.Start(dir, 0)
	if err != nil {
		return nil, err
	}
	b := &broker{dir: dir, emb: emb}
	if b.pub, err = natsjs.Connect(emb.URL(), nil); err != nil {
		return nil, errors.Join(err, b.close())
	}
	if b.stream, err = natsjs.EnsureStream(ctx, b.pub.JetStream(), streamName, subjects, duplicateWindow); err != nil {
		return nil, errors.Join(err, b.close())
	}
	return b, nil
}

// messages returns the number of messages the stream holds.
func (b *broker) messages(ctx context.Context) (uint64, error) {
	info, err := b.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bench: events: stream info: %w", err)
	}
	return info.State.Msgs, nil
}

// close disconnects, stops the server and removes its store.
func (b *broker) close() error {
	var err error
	if b.pub != nil {
		err = b.pub.Close()
	}
	b.emb.Shutdown()
	return errors.Join(err, os.RemoveAll(b.dir))
}
