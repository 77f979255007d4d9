package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/engine"
	"github.com/idemkv/idemkv/pgstore"
	"github.com/idemkv/idemkv/saga"
)

// adminTokenEnv holds the admin API's bearer token when no
// --admin-token-file is given (never a flag value: flags show in ps).
const adminTokenEnv = "IDEMKV_ADMIN_TOKEN"

// adminToken reads the admin API's token from file, or else from the
// environment; surrounding white space is not part of it.
func adminToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("admin token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if tok := strings.TrimSpace(os.Getenv(adminTokenEnv)); tok != "" {
		return tok, nil
	}
	return "", errors.New("the admin API needs a token: --admin-token-file FILE, or " + adminTokenEnv)
}

// adminHandler is the admin API on s's store, with what that store can
// do besides the Store contract, and with s.svc, the payments service
// whose records it settles: a resolve goes through it, and --verify asks
// its reconciler (nil: a resolve writes the record alone, and --verify is
// refused).
func adminHandler(s *service, token string, audit *admin.AuditLog, log *slog.Logger) (http.Handler, error) {
	st, svc := s.st.store, s.svc
	o := &admin.Options{Token: token, Logger: log, Audit: audit, Now: st.Now}
	if s.rw != nil {
		o.NextQuestion = s.rw.Due
	}
	if svc != nil {
		through := settleThrough(svc)
		o.Settler, o.Reconciler = through.Settler, through.Reconciler
		o.Steps = []string{"charge"} // a payment's one downstream call
		if orders := svc.Orders(); orders != nil {
			o.Sagas = []*saga.Runner{orders}
		}
	}
	switch e := st.(type) {
	case *engine.Engine:
		o.Check = func(ctx context.Context) (any, int, error) {
			rep, err := e.Check(ctx)
			return rep, rep.ProblemCount, err
		}
		o.Sweep = func(ctx context.Context) (any, error) { return e.Sweep(ctx) }
		o.Backup = backupWithLedger(e, s.ledger)
		o.Stats = func(context.Context) (any, error) { return e.Stats() }
	case *pgstore.Store:
		o.Stats = func(context.Context) (any, error) { return e.Counts(), nil }
		o.Check = func(ctx context.Context) (any, int, error) {
			rep, err := e.Check(ctx)
			return rep, rep.ProblemCount, err
		}
		o.Sweep = func(ctx context.Context) (any, error) { return e.Sweep(ctx) }
	}
	return admin.New(st, o)
}

// backupWithLedger backs up e into dir and then, when the service charges
// the simulated processor, its ledger into dir/processor, where a serve
// on the restored directory finds it. Without the ledger the restored
// service's reconciler would hear "never charged" about a payment charged
// before the backup, and the retry would charge again. The ledger is
// copied second, so it holds every charge of the attempts in e's copy (a
// charge made between the two copies is found by its payment's retry,
// which sends the same operation id).
func backupWithLedger(e, ledger *engine.Engine) func(context.Context, string) error {
	if ledger == nil {
		return e.Backup
	}
	return func(ctx context.Context, dir string) error {
		if err := e.Backup(ctx, dir); err != nil {
			return err
		}
		if err := ledger.Backup(ctx, filepath.Join(dir, simulatorDir)); err != nil {
			// A copy without its ledger is the hazard above: remove it.
			return errors.Join(err, os.RemoveAll(dir))
		}
		return nil
	}
}

// adminServerFor is the admin API's server, with the public server's
// limits on connections and time, on c.adminLn, resolving through svc
// (adminHandler), and the function that closes its audit log once the
// server is done.
func (c *serveConfig) adminServerFor(s *service, logger *slog.Logger, errLog *log.Logger) (*http.Server, net.Listener, func(), error) {
	tok, err := adminToken(c.adminTokenFile)
	if err != nil {
		return nil, nil, nil, err
	}
	path := c.adminAuditLog
	if _, pebble := s.st.store.(*engine.Engine); path == "" && pebble {
		path = filepath.Join(c.dir, "audit.log")
	}
	var audit *admin.AuditLog
	closeAudit := func() {}
	if path != "" {
		if audit, err = admin.OpenAuditLog(path); err != nil {
			return nil, nil, nil, err
		}
		closeAudit = func() { _ = audit.Close() }
	} else {
		logger.Warn("admin API: no --admin-audit-log, so resolve and evict are off")
	}
	h, err := adminHandler(s, tok, audit, logger)
	if err != nil {
		closeAudit()
		return nil, nil, nil, err
	}
	l := defaultLimits(adminCallTime, adminConns)
	if c.adminLimits != nil {
		l = *c.adminLimits
	}
	srv, cl := newServer(h, l, errLog)
	return srv, cl.Listener(c.adminLn), closeAudit, nil
}

// adminConns bounds the admin API's open connections: an operator's
// tools, not traffic. adminCallTime is what a call may take on top of the
// public limits: a check reads the whole store.
const (
	adminConns    = 16
	adminCallTime = 10 * time.Minute
)
