package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	fprint "github.com/idemkv/idemkv/fingerprint"
)

func init() {
	register(&command{
		name:    "fingerprint",
		args:    "[--mode json|raw|fields] [--field PTR]... [--tenant T --method M --route R --param K=V... --header 'NAME: V'... --query K=V...] [FILE]",
		summary: "print a request's canonical body and fingerprint (FILE, or stdin), to debug a 422",
		maxArgs: 1,
		flags:   fingerprintFlags,
	})
}

// stdin is where the fingerprint command reads a body given no FILE.
var stdin io.Reader = os.Stdin

func fingerprintFlags(fs *flag.FlagSet) func(context.Context, io.Writer) error {
	var (
		req     = fprint.Request{Params: map[string]string{}, Header: map[string][]string{}, Query: map[string][]string{}}
		opts    fprint.Options
		stored  hexFlag
		diagHex hexFlag
	)
	fs.Var(modeFlag{&opts.Mode}, "mode", "how the body is canonicalized (`MODE`): json (RFC 8785, the default), raw (exact bytes) or fields (only the --field members)")
	fs.Func("field", "a JSON Pointer (`PTR`, \"/amount\") covered in fields mode; repeat for more", func(s string) error {
		opts.Fields = append(opts.Fields, s)
		return nil
	})
	fs.StringVar(&req.Tenant, "tenant", "", "the tenant (principal) the request acts for")
	fs.StringVar(&req.Method, "method", "", "the HTTP method, as the service passes it (\"POST\")")
	fs.StringVar(&req.Route, "route", "", "the route pattern that matched (\"/v1/payments/{id}\")")
	fs.Func("param", "a path parameter `K=V`; repeat for more", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("%q is not K=V", s)
		}
		if _, dup := req.Params[k]; dup {
			return fmt.Errorf("path parameter %q given twice", k)
		}
		req.Params[k] = v
		return nil
	})
	fs.Func("header", "a covered header, `'NAME: VALUE'`, repeated for several values; 'NAME' alone covers it as absent", func(s string) error {
		name, value, ok := strings.Cut(s, ":")
		name = strings.TrimSpace(name)
		opts.Headers = append(opts.Headers, name)
		if ok {
			req.Header[name] = append(req.Header[name], strings.Trim(value, " \t"))
		}
		return nil
	})
	fs.Func("query", "a covered query parameter `K=V`, repeated for several values; 'K' alone covers it as absent", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		opts.Query = append(opts.Query, k)
		if ok {
			req.Query[k] = append(req.Query[k], v)
		}
		return nil
	})
	fs.IntVar(&opts.MaxBodySize, "max-body", fprint.DefaultMaxBodySize, "the largest body fingerprinted, in `BYTES`")
	fs.IntVar(&opts.MaxDepth, "max-depth", fprint.DefaultMaxDepth, "the deepest JSON nesting accepted")
	fs.BoolVar(&opts.Diagnostics, "diagnostics", false, "also print the per-part diagnostics digests")
	fs.Var(&stored, "stored", "a stored fingerprint (`HEX`, from the 422's record) to check the request against")
	fs.Var(&diagHex, "stored-diagnostics", "stored diagnostics (`HEX`) to name the parts that differ")

	return func(ctx context.Context, stdout io.Writer) error {
		switch {
		case len(opts.Fields) > 0 && opts.Mode != fprint.ModeFields:
			return usageError{errors.New("--field needs --mode fields")}
		case len(opts.Fields) == 0 && opts.Mode == fprint.ModeFields:
			return usageError{errors.New("--mode fields needs at least one --field")}
		case opts.MaxBodySize <= 0 || opts.MaxDepth <= 0:
			return usageError{errors.New("--max-body and --max-depth must be positive")}
		}
		if err := opts.Validate(); err != nil {
			return usageError{err}
		}
		name, r := "stdin", stdin
		if fs.NArg() == 1 {
			name = fs.Arg(0)
			f, err := os.Open(name)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		// One byte past the limit is enough to report the body too large.
		body, err := io.ReadAll(io.LimitReader(r, int64(opts.MaxBodySize)+1))
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		req.Body = body
		return printFingerprint(stdout, name, req, &opts, stored, diagHex)
	}
}

// printFingerprint computes everything first and prints only if all of it
// succeeded, so that a failing run prints nothing on stdout.
func printFingerprint(stdout io.Writer, name string, req fprint.Request, opts *fprint.Options, stored, diag hexFlag) error {
	fp, err := fprint.Compute(req, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	var body [][2]string // what each line shows about the body
	switch {
	case len(req.Body) == 0:
		body = append(body, [2]string{"body", "(empty)"})
	case opts.Mode == fprint.ModeJSON:
		canon, err := fprint.Canonical(req.Body, opts)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		body = append(body, [2]string{"body", string(canon)})
	case opts.Mode == fprint.ModeFields:
		fields, err := fprint.Select(req.Body, opts)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		for _, f := range fields {
			v := string(f.Value)
			if f.Value == nil {
				v = "(absent)"
			}
			body = append(body, [2]string{displayPointer(f.Pointer), v})
		}
	default:
		b := string(req.Body)
		if !utf8.ValidString(b) {
			b = strconv.Quote(b)
		}
		body = append(body, [2]string{"body", b})
	}
	var verdict string
	if stored != nil {
		ok, err := fprint.Matches(stored, req, opts)
		if err != nil {
			return fmt.Errorf("--stored: %w", err)
		}
		v, _ := fprint.Version(stored)
		verdict = fmt.Sprintf("%x (version %d) does not match: a different request (422)", []byte(stored), v)
		if ok {
			verdict = fmt.Sprintf("%x (version %d) matches: a retry of the stored request", []byte(stored), v)
		}
	}
	var diffs []fprint.Difference
	if diag != nil {
		if diffs, err = fprint.Explain(diag, req, opts); err != nil {
			return fmt.Errorf("--stored-diagnostics: %w", err)
		}
	}

	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "mode\t%s\n", opts.Mode)
	for _, l := range body {
		fmt.Fprintf(w, "%s\t%s\n", l[0], l[1])
	}
	fmt.Fprintf(w, "fingerprint\t%s\n", fp)
	if fp.Diagnostics != nil {
		fmt.Fprintf(w, "diagnostics\t%x\n", fp.Diagnostics)
	}
	if verdict != "" {
		fmt.Fprintf(w, "stored\t%s\n", verdict)
	}
	if diag != nil && len(diffs) == 0 {
		fmt.Fprintf(w, "differs\tnothing\n")
	}
	for _, d := range diffs {
		fmt.Fprintf(w, "differs\t%s\n", d)
	}
	return w.Flush()
}

// displayPointer shows the empty pointer (the whole body) visibly.
func displayPointer(p string) string {
	if p == "" {
		return `""`
	}
	return p
}

// modeFlag is the --mode flag.
type modeFlag struct{ m *fprint.Mode }

func (f modeFlag) String() string {
	if f.m == nil {
		return fprint.ModeJSON.String()
	}
	return f.m.String()
}

func (f modeFlag) Set(s string) error {
	m, err := fprint.ParseMode(s)
	if err != nil {
		return fmt.Errorf("unknown mode %q (want json, raw or fields)", s)
	}
	*f.m = m
	return nil
}

// hexFlag is a flag holding bytes in hex.
type hexFlag []byte

func (f *hexFlag) String() string { return hex.EncodeToString(*f) }

func (f *hexFlag) Set(s string) error {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) == 0 {
		return fmt.Errorf("%q is not hex bytes", s)
	}
	*f = b
	return nil
}
