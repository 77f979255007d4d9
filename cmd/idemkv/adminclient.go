package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/admin"
	"github.com/idemkv/idemkv/httpidem"
)

// adminFlags defines --server (usage says what the command does there)
// and --token-file, the flags of a command that calls a running
// service's admin API.
func adminFlags(fs *flag.FlagSet, server, tokenFile *string, usage string) {
	fs.StringVar(server, "server", "", usage)
	fs.StringVar(tokenFile, "token-file", "", "with --server: the admin API's bearer token is in `FILE` (default: the environment's "+adminTokenEnv+")")
}

// adminClient calls a running service's admin API (package admin).
type adminClient struct {
	base, token string
	hc          *http.Client
}

func newAdminClient(server, tokenFile string) (*adminClient, error) {
	if !strings.HasPrefix(server, "http://") && !strings.HasPrefix(server, "https://") {
		return nil, usageError{fmt.Errorf("--server %q: give the admin API's http:// or https:// URL", server)}
	}
	tok, err := adminToken(tokenFile)
	if err != nil {
		return nil, usageError{err}
	}
	return &adminClient{base: strings.TrimRight(server, "/"), token: tok, hc: &http.Client{Timeout: adminCallTime + time.Minute}}, nil
}

// call sends method path with body (JSON, if not nil) and decodes a 2xx
// answer into out; any other answer is an error holding its problem.
func (c *adminClient) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Close()
	b, err := io.ReadAll(io.LimitReader(resp, 64<<20))
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return errors.Join(errors.New("admin API: unreadable answer"), err)
	}
	return nil
}

// stream sends method path and returns a 2xx answer's body, to be read
// and closed by the caller. Unlike call it has no overall time limit: a
// stream (an export) lasts as long as it makes progress, which the
// server watches; ctx ends it.
func (c *adminClient) stream(ctx context.Context, method, path string) (io.ReadCloser, error) {
	sc := *c
	sc.hc = &http.Client{Transport: c.hc.Transport}
	return sc.do(ctx, method, path, nil)
}

// do sends the request and returns a 2xx answer's body; any other answer
// is an error holding its problem.
func (c *adminClient) do(ctx context.Context, method, path string, body any) (io.ReadCloser, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp.Body, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var p httpidem.Problem
	if json.Unmarshal(b, &p) == nil && p.Title != "" {
		return nil, fmt.Errorf("admin API: %d %s: %s", resp.StatusCode, p.Title, p.Detail)
	}
	return nil, fmt.Errorf("admin API: %s", resp.Status)
}

// listRecords pages through the service's listing up to req.Limit
// records, as the store would list them (what the admin API shows).
func (c *adminClient) listRecords(ctx context.Context, req idemkv.ListRequest) ([]idemkv.Record, error) {
	var out []idemkv.Record
	for len(out) < req.Limit {
		q := url.Values{"escalated": {strconv.FormatBool(req.Escalated)}, "limit": {strconv.Itoa(min(req.Limit-len(out), 1000))}}
		if req.Tenant != "" {
			q.Set("tenant", req.Tenant)
		}
		if req.After != "" {
			q.Set("after", req.After)
		}
		var page struct {
			Records []admin.RecordView `json:"records"`
			Next    string             `json:"next"`
		}
		if err := c.call(ctx, http.MethodGet, "/admin/v1/pending?"+q.Encode(), nil, &page); err != nil {
			return nil, err
		}
		for i := range page.Records {
			out = append(out, recordOfView(&page.Records[i]))
		}
		if page.Next == "" {
			break
		}
		req.After = page.Next
	}
	return out, nil
}

// recordOfView is the part of a record its admin view carries that the
// listing prints.
func recordOfView(v *admin.RecordView) idemkv.Record {
	r := idemkv.Record{ID: idemkv.ID{Tenant: v.Tenant, Endpoint: v.Endpoint, Key: v.Key}, Escalated: v.Escalated,
		Token: v.Token, Attempt: v.Attempt, Created: v.Created, Expires: v.Expires, Note: v.Note}
	for _, s := range []idemkv.State{idemkv.StateInProgress, idemkv.StateUncertain, idemkv.StateCompleted} {
		if s.String() == v.State {
			r.State = s
		}
	}
	if b, err := hex.DecodeString(v.OperationID); err == nil {
		copy(r.OperationID[:], b)
	}
	return r
}
