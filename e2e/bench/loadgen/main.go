// Command loadgen is the benchmarks' closed-loop load generator: N connections, each sending the
// next request as soon as the last one ends, for a fixed time after a warm-up.
//
// It does what e2e/bench/load.py does (same arguments, same JSON line), with the standard
// library's HTTP client in place of aiohttp: a Python client at ~2,400 req/s burns most of a
// core, which on a 2-core machine is taken from the server it measures.
//
//	loadgen URL CONCURRENCY SECONDS plain|stream|first
//
// The bearer key, if any, comes from FLEET_BENCH_KEY (never argv). It runs on one core
// (GOMAXPROCS=1 unless the environment sets it). "plain" and "stream" time
// whole responses; "first" times a stream's first SSE frame, then reads the rest.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"
)

const bodyTemplate = `{"model": "bench", "messages": [{"role": "user", "content": "benchmark me"}], ` +
	`"max_tokens": 16, "stream": %t}`

type target struct {
	client *http.Client
	url    string
	body   []byte
	key    string
	first  bool
}

// one sends one request; its latency, whether it got a 200, and a transport error if any.
func (t *target) one() (time.Duration, bool, error) {
	req, err := http.NewRequest(http.MethodPost, t.url, bytes.NewReader(t.body))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.key != "" {
		req.Header.Set("Authorization", "Bearer "+t.key)
	}
	start := time.Now()
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var latency time.Duration
	if t.first {
		if err := untilFrameEnd(bufio.NewReader(resp.Body)); err != nil {
			return 0, false, err
		}
		latency = time.Since(start)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, false, err
	}
	if !t.first {
		latency = time.Since(start)
	}
	return latency, resp.StatusCode == http.StatusOK, nil
}

// untilFrameEnd reads up to the first blank line: the end of the first SSE frame.
func untilFrameEnd(r *bufio.Reader) error {
	previous := byte(0)
	for {
		b, err := r.ReadByte()
		if err != nil {
			return err
		}
		if b == '\n' && previous == '\n' {
			return nil
		}
		previous = b
	}
}

type tally struct {
	latencies []time.Duration
	errors    int
}

// worker loops until the deadline, one request after another on its connection.
func (t *target) worker(until time.Time, out *tally) {
	for time.Now().Before(until) {
		latency, ok, err := t.one()
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

func (t *target) phase(concurrency int, seconds float64) ([]tally, time.Duration) {
	tallies := make([]tally, concurrency)
	start := time.Now()
	until := start.Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Add(1)
		go func(out *tally) {
			defer wg.Done()
			t.worker(until, out)
		}(&tallies[i])
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

func newTarget(base string, concurrency int, mode, key string) *target {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        concurrency,
		MaxIdleConnsPerHost: concurrency,
		MaxConnsPerHost:     concurrency,
		DisableCompression:  true,
		IdleConnTimeout:     90 * time.Second,
	}
	return &target{
		client: &http.Client{Transport: transport, Timeout: 120 * time.Second},
		url:    base + "/v1/chat/completions",
		body:   []byte(fmt.Sprintf(bodyTemplate, mode != "plain")),
		key:    key,
		first:  mode == "first",
	}
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
	t := newTarget(base, concurrency, mode, os.Getenv("FLEET_BENCH_KEY"))
	t.phase(concurrency, math.Min(1.0, seconds/4)) // warm-up: connections opened, not counted
	tallies, elapsed := t.phase(concurrency, seconds)
	fmt.Println(summarize(tallies, elapsed).line())
}
