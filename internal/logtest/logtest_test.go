package logtest_test

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkv/idemkv/internal/logtest"
)

func TestLog(t *testing.T) {
	g, logger := logtest.New(slog.LevelInfo)
	assert.Empty(t, g.Records(t))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { logger.Info("hello", "n", i) })
	}
	wg.Wait()
	logger.Debug("left out")
	recs := g.Records(t)
	assert.Len(t, recs, 4)
	for _, m := range recs {
		assert.Equal(t, "INFO", m["level"])
		assert.Equal(t, "hello", m["msg"])
	}
	assert.Len(t, g.Take(t), 4)
	assert.Empty(t, g.String(), "Take empties the log")
	logger.Warn("again")
	recs = g.Take(t)
	assert.Len(t, recs, 1)
	assert.Equal(t, "again", recs[0]["msg"])

	var w logtest.Log // the zero value, as a plain writer
	_, err := w.Write([]byte("\n{\"a\":1}\n\n"))
	assert.NoError(t, err)
	assert.Equal(t, []map[string]any{{"a": 1.0}}, w.Records(t))
}
