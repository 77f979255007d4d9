package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemkv/idemkv/httpidem"
)

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
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var p httpidem.Problem
		if json.Unmarshal(b, &p) == nil && p.Title != "" {
			return fmt.Errorf("admin API: %d %s: %s", resp.StatusCode, p.Title, p.Detail)
		}
		return fmt.Errorf("admin API: %s", resp.Status)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return errors.Join(errors.New("admin API: unreadable answer"), err)
	}
	return nil
}
