// Command loadgen is the benchmarks' closed-loop load generator: N connections, each sending the
// next request as soon as the last one ends, for a fixed time after a warm-up.
//
// It does what bench/load.py does (same arguments, same JSON line), with a minimal HTTP/1.1
// client of its own in place of aiohttp: a Python client at ~2,400 req/s burns most of a core,
// which on a 2-core machine is taken from the server it measures. It is not net/http's client
// either: that one hands every request between three goroutines (the caller, a read loop and a
// write loop per connection) and builds a Request, a Response and header maps for each, and on
// 2 cores shared with the server under test that cost more than a third of what a gateway worker
// spends per request (ADR 0002). Here one goroutine drives every connection from an
// epoll loop (loop.go; Linux only, as the benches are): it writes the same prepared request bytes
// and reads the answer in place: the status line, the headers it needs (Content-Length,
// Transfer-Encoding: chunked, Connection: close) and the body, discarded.
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
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
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

// head is what the generator needs of a response's status line and headers.
type head struct {
	status  int
	length  int64 // -1: not given
	chunked bool
	closing bool // Connection: close, or a body that runs to the end of the connection
}

// errIncomplete: the bytes so far hold only part of an answer.
var errIncomplete = errors.New("incomplete answer")

// answer is one whole response read from the front of a connection's bytes.
type answer struct {
	head
	used int // its bytes, head and body
}

// parseAnswer reads a response from data (what the connection has received since the last
// one): the answer when whole, errIncomplete when not yet; eof says the server closed after data.
// With scan, it also reports whether the body so far holds the end of an SSE frame (two
// newlines in a row).
func parseAnswer(data []byte, eof bool, scan *frameScan) (answer, error) {
	line, rest, ok := cutLine(data)
	if !ok {
		return answer{}, errIncomplete
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return answer{}, fmt.Errorf("not an HTTP/1.x status line: %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return answer{}, fmt.Errorf("bad status line %q", line)
	}
	// HTTP/1.0 closes after each answer unless it says keep-alive; 1.1 keeps it unless "close".
	h := head{status: status, length: -1, closing: line[7] == '0'}
	for {
		line, rest, ok = cutLine(rest)
		if !ok {
			return answer{}, errIncomplete
		}
		if len(line) == 0 {
			break
		}
		if err := h.header(line); err != nil {
			return answer{}, err
		}
	}
	at := len(data) - len(rest)
	switch {
	case h.status < 200 || h.status == 204 || h.status == 304:
		return answer{h, at}, nil
	case h.chunked:
		return chunks(h, data, at, scan)
	case h.length >= 0:
		end := at + int(min(h.length, int64(len(data)-at)))
		scan.look(data[at:end])
		if int64(len(data)-at) < h.length {
			return answer{}, errIncomplete
		}
		return answer{h, end}, nil
	}
	h.closing = true // the body is whatever comes until the server closes
	scan.look(data[at:])
	if !eof {
		return answer{}, errIncomplete
	}
	return answer{h, len(data)}, nil
}

func chunks(h head, data []byte, at int, scan *frameScan) (answer, error) {
	for {
		line, rest, ok := cutLine(data[at:])
		if !ok {
			return answer{}, errIncomplete
		}
		digits, _, _ := bytes.Cut(line, []byte(";"))
		size, err := strconv.ParseInt(string(bytes.TrimSpace(digits)), 16, 64)
		if err != nil || size < 0 {
			return answer{}, fmt.Errorf("bad chunk size line %q", line)
		}
		at = len(data) - len(rest)
		if size == 0 {
			return trailers(h, data, at)
		}
		end := at + int(min(size, int64(len(data)-at)))
		scan.look(data[at:end])
		if int64(len(data)-at) < size+2 {
			return answer{}, errIncomplete
		}
		at += int(size) + 2 // the chunk's data and its CRLF
	}
}

func trailers(h head, data []byte, at int) (answer, error) {
	for {
		line, rest, ok := cutLine(data[at:])
		if !ok {
			return answer{}, errIncomplete
		}
		at = len(data) - len(rest)
		if len(line) == 0 {
			return answer{h, at}, nil
		}
	}
}

// cutLine splits off the first line (without its CRLF); false when there is no whole line.
func cutLine(data []byte) ([]byte, []byte, bool) {
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		return nil, data, false
	}
	return bytes.TrimRight(data[:i], "\r"), data[i+1:], true
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

// frameScan looks through a body's bytes, in order, for the end of its first SSE frame (its
// first blank line: two newlines in a row). nil: not looking.
type frameScan struct {
	previous byte
	found    bool
}

func (f *frameScan) look(data []byte) {
	if f == nil || f.found {
		return
	}
	for _, c := range data {
		if c == '\n' && f.previous == '\n' {
			f.found = true
			return
		}
		f.previous = c
	}
}

type tally struct {
	latencies []time.Duration
	errors    int
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
	l, err := newLoop(t, concurrency)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	l.phase(math.Min(1.0, seconds/4)) // warm-up: connections opened, not counted
	tallies, elapsed := l.phase(seconds)
	fmt.Println(summarize(tallies, elapsed).line())
}
