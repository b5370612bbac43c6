// Command loadgen is the benchmarks' closed-loop load generator: N connections, each sending the
// next request as soon as the last one ends, for a fixed time after a warm-up.
//
// It does what e2e/bench/load.py does (same arguments, same JSON line), with a minimal HTTP/1.1
// client of its own in place of aiohttp: a Python client at ~2,400 req/s burns most of a core,
// which on a 2-core machine is taken from the server it measures. It is not net/http's client
// either: that one hands every request between three goroutines (the caller, a read loop and a
// write loop per connection) and builds a Request, a Response and header maps for each, and on
// 2 cores shared with the server under test that cost more than a third of what a gateway worker
// spends per request (ADR 0002, session 8). Here each connection is one goroutine that writes the
// same prepared request bytes and reads the answer in place: the status line, the headers it
// needs (Content-Length, Transfer-Encoding: chunked, Connection: close) and the body, discarded.
//
//	loadgen URL CONCURRENCY SECONDS plain|stream|first
//
// URL is http://HOST:PORT (no TLS). The bearer key, if any, comes from FLEET_BENCH_KEY (never
// argv). It runs on one core (GOMAXPROCS=1 unless the environment sets it). "plain" and
// "stream" time whole responses; "first" times a stream's first SSE frame, then reads the rest.
// A transport error closes the connection (the next request dials again) and counts as an
// error, as does any status other than 200.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const bodyTemplate = `{"model": "bench", "messages": [{"role": "user", "content": "benchmark me"}], ` +
	`"max_tokens": 16, "stream": %t}`

// requestTimeout bounds one request (at least half of it; see extend), as net/http's client
// timeout did.
const requestTimeout = 120 * time.Second

type target struct {
	address string
	request []byte // the whole request, written as is on every round trip
	first   bool
}

// conn is one keep-alive connection; nil until dialled, and again after an error.
type conn struct {
	net.Conn
	r        *bufio.Reader
	deadline time.Time // the connection's read and write deadline, moved on now and then
}

// one sends one request on *c (dialling it first when needed); its latency, whether it got a
// 200, and a transport error if any (after which *c is closed and nil).
func (t *target) one(c **conn) (time.Duration, bool, error) {
	start := time.Now()
	latency, ok, err := t.roundTrip(c, start)
	if err != nil && *c != nil {
		(*c).Close()
		*c = nil
	}
	return latency, ok, err
}

func (t *target) roundTrip(c **conn, start time.Time) (time.Duration, bool, error) {
	if *c == nil {
		raw, err := net.DialTimeout("tcp", t.address, 10*time.Second)
		if err != nil {
			return 0, false, err
		}
		*c = &conn{Conn: raw, r: bufio.NewReaderSize(raw, 64<<10)}
	}
	cn := *c
	if err := cn.extend(start); err != nil {
		return 0, false, err
	}
	if _, err := cn.Write(t.request); err != nil {
		return 0, false, err
	}
	h, err := readHead(cn.r)
	if err != nil {
		return 0, false, err
	}
	b := body{r: cn.r, watch: t.first}
	if err := b.read(h); err != nil {
		return 0, false, err
	}
	latency := time.Since(start)
	if t.first {
		if b.frameAt.IsZero() {
			return 0, false, errors.New("the stream ended before its first frame")
		}
		latency = b.frameAt.Sub(start)
	}
	if h.closing {
		cn.Close()
		*c = nil
	}
	return latency, h.status == 200, nil
}

// extend keeps the deadline at least requestTimeout/2 ahead of a request starting at start, so
// a request is bounded by 60 to 120 s. Moving it on every request, as before, took a lock and a
// runtime timer update per request, for a timer that never fires.
func (cn *conn) extend(start time.Time) error {
	if cn.deadline.Sub(start) >= requestTimeout/2 {
		return nil
	}
	cn.deadline = start.Add(requestTimeout)
	return cn.SetDeadline(cn.deadline)
}

// head is what the generator needs of a response's status line and headers.
type head struct {
	status  int
	length  int64 // -1: not given
	chunked bool
	closing bool // Connection: close, or a body that runs to the end of the connection
}

func readHead(r *bufio.Reader) (head, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return head{}, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return head{}, fmt.Errorf("not an HTTP/1.x status line: %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return head{}, fmt.Errorf("bad status line %q", line)
	}
	// HTTP/1.0 closes after each answer unless it says keep-alive; 1.1 keeps it unless "close".
	h := head{status: status, length: -1, closing: line[7] == '0'}
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return head{}, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		if err := h.header(line); err != nil {
			return head{}, err
		}
	}
	if h.length < 0 && !h.chunked && h.status >= 200 && h.status != 204 && h.status != 304 {
		h.closing = true // the body is whatever comes until the server closes
	}
	return h, nil
}

func (h *head) header(line []byte) error {
	name, value, found := bytes.Cut(line, []byte(":"))
	if !found {
		return fmt.Errorf("bad header line %q", line)
	}
	value = bytes.TrimSpace(value)
	switch {
	case bytes.EqualFold(name, []byte("content-length")):
		n, err := strconv.ParseInt(string(value), 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("bad Content-Length %q", value)
		}
		h.length = n
	case bytes.EqualFold(name, []byte("transfer-encoding")):
		h.chunked = bytes.Contains(bytes.ToLower(value), []byte("chunked"))
	case bytes.EqualFold(name, []byte("connection")):
		options := bytes.ToLower(value)
		h.closing = bytes.Contains(options, []byte("close")) ||
			h.closing && !bytes.Contains(options, []byte("keep-alive"))
	}
	return nil
}

// body reads a response body and drops it; with watch, it notes when the first SSE frame
// ended (its first blank line: two newlines in a row).
type body struct {
	r        *bufio.Reader
	watch    bool
	previous byte
	frameAt  time.Time
}

func (b *body) read(h head) error {
	switch {
	case h.status < 200 || h.status == 204 || h.status == 304:
		return nil
	case h.chunked:
		return b.chunks()
	case h.length >= 0:
		return b.take(h.length)
	}
	if err := b.take(math.MaxInt64); !errors.Is(err, io.EOF) { // until the server closes
		return err
	}
	return nil
}

func (b *body) chunks() error {
	for {
		line, err := b.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		digits, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		size, err := strconv.ParseInt(string(bytes.TrimSpace(digits)), 16, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("bad chunk size line %q", line)
		}
		if size == 0 {
			return b.trailers()
		}
		if err := b.take(size); err != nil {
			return err
		}
		if _, err := b.r.Discard(2); err != nil { // the CRLF after the chunk's data
			return err
		}
	}
}

func (b *body) trailers() error {
	for {
		line, err := b.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return nil
		}
	}
}

// take drops n bytes of body, looking for the first frame's end in them while watching.
func (b *body) take(n int64) error {
	for n > 0 && b.watch && b.frameAt.IsZero() {
		if b.r.Buffered() == 0 {
			if _, err := b.r.Peek(1); err != nil {
				return err
			}
		}
		k := int(min(n, int64(b.r.Buffered())))
		data, _ := b.r.Peek(k)
		for _, c := range data {
			if c == '\n' && b.previous == '\n' {
				b.frameAt = time.Now()
				break
			}
			b.previous = c
		}
		b.r.Discard(k)
		n -= int64(k)
	}
	for n > 0 {
		k := int(min(n, math.MaxInt32))
		if _, err := b.r.Discard(k); err != nil {
			return err
		}
		n -= int64(k)
	}
	return nil
}

type tally struct {
	latencies []time.Duration
	errors    int
}

// worker loops until the deadline, one request after another on its connection.
func (t *target) worker(c **conn, until time.Time, out *tally) {
	for time.Now().Before(until) {
		latency, ok, err := t.one(c)
		switch {
		case err != nil:
			out.errors++
			time.Sleep(10 * time.Millisecond) // a refused connection must not spin a core
		case !ok:
			out.errors++
		default:
			out.latencies = append(out.latencies, latency)
		}
	}
}

// phase runs one worker per connection in conns (kept open across phases) for seconds.
func (t *target) phase(conns []*conn, seconds float64) ([]tally, time.Duration) {
	tallies := make([]tally, len(conns))
	start := time.Now()
	until := start.Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			t.worker(&conns[i], until, &tallies[i])
		}(i)
	}
	wg.Wait()
	return tallies, time.Since(start)
}

func percentile(ordered []time.Duration, q float64) float64 {
	if len(ordered) == 0 {
		return math.NaN()
	}
	i := int(q * float64(len(ordered)))
	if i > len(ordered)-1 {
		i = len(ordered) - 1
	}
	return float64(ordered[i]) / float64(time.Millisecond)
}

// result is load.py's JSON line: same keys, same order.
type result struct {
	RPS, P50, P99    float64
	Requests, Errors int
}

// line writes what Python's json.dumps would (NaN included, which encoding/json refuses).
func (r result) line() string {
	f := func(v float64) string {
		if math.IsNaN(v) {
			return "NaN"
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return fmt.Sprintf(`{"rps": %s, "p50_ms": %s, "p99_ms": %s, "requests": %d, "errors": %d}`,
		f(r.RPS), f(r.P50), f(r.P99), r.Requests, r.Errors)
}

func summarize(tallies []tally, elapsed time.Duration) result {
	var all []time.Duration
	errs := 0
	for _, t := range tallies {
		all = append(all, t.latencies...)
		errs += t.errors
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return result{
		RPS:      float64(len(all)) / elapsed.Seconds(),
		P50:      percentile(all, 0.5),
		P99:      percentile(all, 0.99),
		Requests: len(all),
		Errors:   errs,
	}
}

// newTarget prepares the request every round trip writes: POST {base}/v1/chat/completions.
func newTarget(base, mode, key string) (*target, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("URL %q is not http://HOST:PORT", base)
	}
	address := u.Host
	if u.Port() == "" {
		address = net.JoinHostPort(u.Hostname(), "80")
	}
	body := fmt.Sprintf(bodyTemplate, mode != "plain")
	var request bytes.Buffer
	fmt.Fprintf(&request, "POST %s/v1/chat/completions HTTP/1.1\r\nHost: %s\r\n", strings.TrimSuffix(u.EscapedPath(), "/"), u.Host)
	fmt.Fprintf(&request, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	if key != "" {
		fmt.Fprintf(&request, "Authorization: Bearer %s\r\n", key)
	}
	request.WriteString("\r\n" + body)
	return &target{address: address, request: request.Bytes(), first: mode == "first"}, nil
}

func parse(args []string) (string, int, float64, string, error) {
	if len(args) != 4 {
		return "", 0, 0, "", errors.New("usage: loadgen URL CONCURRENCY SECONDS plain|stream|first")
	}
	concurrency, err := strconv.Atoi(args[1])
	if err != nil || concurrency < 1 {
		return "", 0, 0, "", fmt.Errorf("CONCURRENCY %q is not a positive integer", args[1])
	}
	seconds, err := strconv.ParseFloat(args[2], 64)
	if err != nil || seconds <= 0 {
		return "", 0, 0, "", fmt.Errorf("SECONDS %q is not a positive number", args[2])
	}
	if mode := args[3]; mode != "plain" && mode != "stream" && mode != "first" {
		return "", 0, 0, "", fmt.Errorf("mode %q is not plain, stream or first", mode)
	}
	return args[0], concurrency, seconds, args[3], nil
}

func main() {
	base, concurrency, seconds, mode, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		// One core is plenty for a few thousand requests/s, and idle Ps spinning for work on a
		// second core would take CPU from the server being measured.
		runtime.GOMAXPROCS(1)
	}
	t, err := newTarget(base, mode, os.Getenv("FLEET_BENCH_KEY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	conns := make([]*conn, concurrency)
	t.phase(conns, math.Min(1.0, seconds/4)) // warm-up: connections opened, not counted
	tallies, elapsed := t.phase(conns, seconds)
	fmt.Println(summarize(tallies, elapsed).line())
}
