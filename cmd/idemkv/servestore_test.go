package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRedactURL(t *testing.T) {
	assert.Equal(t, "app@db1:5432,db2:5433/pay",
		redactURL("postgres://app:secret@db1:5432,db2:5433/pay?target_session_attrs=read-write"))
	assert.NotContains(t, redactURL("postgres://app:secret@db1/pay"), "secret")
}
