// Command stubgo is a cheap OpenAI-compatible stub engine for the gateway benchmarks.
//
// It answers what the benches ask of fleet_core.devtools.stub_engine (vLLM profile, no delay): POST
// /v1/chat/completions and /v1/completions (JSON with usage, or SSE with one frame per token, a
// usage frame when stream_options.include_usage is set, then [DONE]), GET /v1/models, /health
// (empty 200, as vLLM) and /metrics (vLLM's running/waiting gauges, which the gateway scrapes, and a
// count of generation requests received, which the instructions bench reads).
// The reply is the Python stub's canned one, cut to max_tokens; a token is a word. Standard
// library only, its own HTTP/1.1 server on one epoll loop (server.go; Linux only, as the
// benches are), so the engine costs a fraction of the CPU the gateway under test does.
//
// Usage: stubgo PORT [MODEL]. When FLEET_STUB_API_KEY is set, /v1 routes require it as a bearer.
// FLEET_STUB_TOKEN_DELAY_MS (milliseconds, default 0) is the Python stub's --token-delay-ms: a
// stream sends its role frame at once, then waits that long before each token frame (written one
// by one); a whole response waits that long per token before it is sent.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const reply = "Hello from the Fleet stub engine: this is a canned reply."

const maxBody = 1 << 20

type completion struct {
	Model               *string         `json:"model"`
	Messages            []message       `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type message struct {
	Content json.RawMessage `json:"content"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type stub struct {
	model   string
	key     string
	tokens  []string // the reply, one word a token, the separating space on the later word
	running atomic.Int64
	served  atomic.Int64 // generation requests received, on /metrics for the instructions bench
	models  []byte
	delay   time.Duration // before each generated token (FLEET_STUB_TOKEN_DELAY_MS)
	// Made once, so that an answer is appended bytes rather than encoding/json over maps (which
	// was half of the stub's CPU per request, taken from the gateway it serves on 2 cores).
	quotedModel  []byte   // the model name as a JSON string
	quotedTokens [][]byte // each token as a JSON string
	quotedTexts  [][]byte // the first n tokens joined, as a JSON string, for n = 0..len(tokens)
}

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: stubgo PORT [MODEL]")
		os.Exit(2)
	}
	port, err := strconv.Atoi(os.Args[1])
	if err != nil || port <= 0 || port > 65535 {
		fmt.Fprintln(os.Stderr, "stubgo: PORT must be a number from 1 to 65535")
		os.Exit(2)
	}
	model := "fleet-stub"
	if len(os.Args) == 3 {
		model = os.Args[2]
	}
	s := &stub{model: model, key: os.Getenv("FLEET_STUB_API_KEY")}
	if s.delay, err = tokenDelay(os.Getenv("FLEET_STUB_TOKEN_DELAY_MS")); err != nil {
		fmt.Fprintln(os.Stderr, "stubgo:", err)
		os.Exit(2)
	}
	s.prepare()
	if os.Getenv("GOMAXPROCS") == "" {
		// As the load generator: one core is plenty for the stub, and idle Ps spinning or being
		// woken for work on the second core take CPU from the gateway under test.
		runtime.GOMAXPROCS(1)
	}
	s.models, _ = json.Marshal(map[string]any{"object": "list", "data": []any{map[string]any{
		"id": model, "object": "model", "created": time.Now().Unix(), "owned_by": "vllm",
		"root": model, "parent": nil, "max_model_len": 4096,
	}}})
	err = s.serve(port)
	fmt.Fprintln(os.Stderr, "stubgo:", err)
	os.Exit(1)
}

// prepare splits the reply into tokens and quotes, once, what every answer carries.
func (s *stub) prepare() {
	quote := func(text string) []byte {
		quoted, _ := json.Marshal(text)
		return quoted
	}
	s.quotedModel = quote(s.model)
	s.quotedTexts = [][]byte{quote("")}
	for i, word := range strings.Fields(reply) {
		if i > 0 {
			word = " " + word
		}
		s.tokens = append(s.tokens, word)
		s.quotedTokens = append(s.quotedTokens, quote(word))
		s.quotedTexts = append(s.quotedTexts, quote(strings.Join(s.tokens, "")))
	}
}

// tokenDelay reads FLEET_STUB_TOKEN_DELAY_MS: milliseconds (fractions allowed), empty for none.
func tokenDelay(value string) (time.Duration, error) {
	if value == "" {
		return 0, nil
	}
	ms, err := strconv.ParseFloat(value, 64)
	if err != nil || ms < 0 || ms > 60_000 {
		return 0, fmt.Errorf("FLEET_STUB_TOKEN_DELAY_MS must be milliseconds from 0 to 60000, not %q", value)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// route answers one request: net/http's ServeMux's answers for a path it does not know (404) or
// a method a path does not take (405).
func (s *stub) route(c *connection, req *request) {
	method := string(req.method)
	switch path := string(req.path); path {
	case "/v1/chat/completions", "/v1/completions":
		if method != "POST" {
			c.reply(405, textPlain, []byte("Method Not Allowed\n"), req.close)
		} else if s.authed(c, req) {
			s.generate(c, req, path == "/v1/chat/completions")
		}
	case "/v1/models", "/health", "/metrics":
		switch {
		case method != "GET":
			c.reply(405, textPlain, []byte("Method Not Allowed\n"), req.close)
		case path == "/health":
			c.reply(200, "", nil, req.close) // empty, as vLLM
		case path == "/metrics":
			s.metrics(c, req)
		case s.authed(c, req):
			c.reply(200, "application/json", s.models, req.close)
		}
	default:
		c.reply(404, textPlain, []byte("404 page not found\n"), req.close)
	}
}

func (s *stub) authed(c *connection, req *request) bool {
	if s.key != "" && string(req.auth) != "Bearer "+s.key {
		fail(c, req, 401, "Unauthorized", "AuthenticationError")
		return false
	}
	return true
}

func (s *stub) metrics(c *connection, req *request) {
	c.frame = fmt.Appendf(c.frame[:0], "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"+
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=%q} %d\n"+
		"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"+
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=%q} 0\n"+
		"# HELP stub_requests_total Generation requests received (not a vLLM metric).\n"+
		"# TYPE stub_requests_total counter\nstub_requests_total %d\n",
		s.model, s.running.Load(), s.model, s.served.Load())
	c.reply(200, "text/plain; version=0.0.4; charset=utf-8", c.frame, req.close)
}

func fail(c *connection, req *request, status int, msg, kind string) {
	body, _ := json.Marshal(map[string]any{"object": "error", "message": msg, "type": kind, "param": nil, "code": status})
	c.reply(status, "application/json", body, req.close)
}

func (s *stub) generate(c *connection, r *request, chat bool) {
	s.served.Add(1)
	s.running.Add(1)
	c.running++ // until its answer ends (server.go)
	var req completion
	err := errors.New("http: request body too large") // net/http's words for it
	if !r.tooLarge {
		err = json.Unmarshal(r.body, &req)
	}
	if err != nil {
		fail(c, r, 400, "The request body is not valid JSON: "+err.Error(), "BadRequestError")
		return
	}
	if req.Model != nil && *req.Model != s.model {
		fail(c, r, 404, fmt.Sprintf("The model `%s` does not exist.", *req.Model), "NotFoundError")
		return
	}
	limit := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		limit = req.MaxCompletionTokens
	}
	if !chat && limit == nil {
		sixteen := 16 // vLLM's and OpenAI's default for legacy completions
		limit = &sixteen
	}
	if limit != nil && *limit < 1 {
		fail(c, r, 400, "max_tokens must be at least 1", "BadRequestError")
		return
	}
	n, finish := len(s.tokens), "stop"
	if limit != nil && *limit < n {
		n, finish = *limit, "length"
	}
	prompt := promptTokens(req, chat)
	use := usage{prompt, n, prompt + n}
	head := s.head(chat, req.Stream, time.Now().Unix())
	if req.Stream {
		includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		s.stream(c, r, chat, head, n, finish, use, includeUsage)
		return
	}
	c.pause(s.delay * time.Duration(n))
	body := append(head, `,"choices":[`...)
	if chat {
		body = append(body, `{"index":0,"message":{"role":"assistant","content":`...)
		body = append(body, s.quotedTexts[n]...)
		body = append(body, `,"tool_calls":[]}`...)
	} else {
		body = append(body, `{"index":0,"text":`...)
		body = append(body, s.quotedTexts[n]...)
	}
	body = append(body, `,"logprobs":null,"finish_reason":"`+finish+`","stop_reason":null}],"usage":`...)
	body = append(use.appendJSON(body), '}')
	c.reply(200, "application/json", body, r.close)
}

// head opens an answer's JSON object: id, object, created and model, left open for the rest.
func (s *stub) head(chat, stream bool, created int64) []byte {
	object := "text_completion"
	if chat && stream {
		object = "chat.completion.chunk"
	} else if chat {
		object = "chat.completion"
	}
	b := make([]byte, 0, 512)
	b = append(b, `{"id":"`...)
	b = appendID(b, chat)
	b = append(b, `","object":"`+object+`","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	return append(b, s.quotedModel...)
}

func (u usage) appendJSON(b []byte) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
	return append(b, '}')
}

// stream writes vLLM's framing: the chat role frame, one frame per token (a reply cut by
// max_tokens finishes on its last one; otherwise an empty "stop" frame closes it), the usage
// frame when asked for (then every chunk carries "usage": null), and [DONE]. With a token delay,
// the frames before the first token go at once and each token frame after its delay. “head“
// is every chunk's opening (`head`).
func (s *stub) stream(c *connection, r *request, chat bool, head []byte, n int,
	finish string, use usage, includeUsage bool) {
	tail := "}"
	if includeUsage {
		tail = `,"usage":null}`
	}
	var buf bytes.Buffer
	buf.Grow(2048)
	frame := func(open, quoted []byte, end string) {
		buf.WriteString("data: ")
		buf.Write(head)
		buf.WriteString(`,"choices":[`)
		buf.Write(open)
		buf.Write(quoted)
		buf.WriteString(end + "]" + tail + "\n\n")
	}
	open := []byte(`{"index":0,"text":`)
	middle := `,"logprobs":null,"finish_reason":null}`
	last := `,"logprobs":null,"finish_reason":"` + finish + `","stop_reason":null}`
	if chat {
		open = []byte(`{"index":0,"delta":{"content":`)
		middle, last = "}"+middle, "}"+last
	}
	content := func(quoted []byte, final bool) {
		if final {
			frame(open, quoted, last)
		} else {
			frame(open, quoted, middle)
		}
	}
	if chat {
		frame([]byte(`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`), nil, "")
	}
	var ends []int // with a delay: where the opening and then each token frame end
	mark := func() {
		if s.delay > 0 {
			ends = append(ends, buf.Len())
		}
	}
	mark()
	for i := range n {
		content(s.quotedTokens[i], finish == "length" && i == n-1)
		mark()
	}
	if finish == "stop" {
		content(s.quotedTexts[0], true)
	}
	if includeUsage {
		buf.WriteString("data: ")
		buf.Write(head)
		buf.WriteString(`,"choices":[],"usage":`)
		buf.Write(use.appendJSON(nil))
		buf.WriteString("}\n\n")
	}
	buf.WriteString("data: [DONE]\n\n")
	c.chunked("text/event-stream; charset=utf-8", "no-cache", r.close)
	if s.delay == 0 {
		c.chunk(buf.Bytes(), true)
		return
	}
	s.paced(c, buf.Bytes(), ends)
}

// paced adds body up to ends[0] at once (after the head), then each later piece up to ends[i]
// held for the token delay after the one before, a chunk each, and the rest (closing, usage,
// [DONE]) with the last; the server writes each when due and drops them if the client leaves.
func (s *stub) paced(c *connection, body []byte, ends []int) {
	start := 0
	for i, end := range ends {
		if i > 0 {
			c.pause(s.delay)
		}
		c.chunk(body[start:end], false)
		start = end
	}
	c.chunk(body[start:], true)
}

func promptTokens(req completion, chat bool) int {
	count := 0
	words := func(raw json.RawMessage) {
		var text string
		if json.Unmarshal(raw, &text) == nil {
			count += len(strings.Fields(text))
			return
		}
		var parts []struct {
			Text *string `json:"text"`
		}
		if json.Unmarshal(raw, &parts) == nil {
			for _, part := range parts {
				if part.Text != nil {
					count += len(strings.Fields(*part.Text))
				}
			}
			return
		}
		var texts []string
		if json.Unmarshal(raw, &texts) == nil {
			for _, t := range texts {
				count += len(strings.Fields(t))
			}
		}
	}
	if chat {
		for _, m := range req.Messages {
			words(m.Content)
		}
	} else if len(req.Prompt) > 0 {
		words(req.Prompt)
	}
	return count
}

// appendID appends a fresh id: vLLM's prefix and 32 hex digits (math/rand: an id needs to be
// unlikely to repeat, not secret, and crypto/rand cost a system call per answer).
func appendID(b []byte, chat bool) []byte {
	if chat {
		b = append(b, "chatcmpl-"...)
	} else {
		b = append(b, "cmpl-"...)
	}
	for range 2 {
		word := strconv.FormatUint(rand.Uint64(), 16)
		b = append(b, "0000000000000000"[len(word):]...)
		b = append(b, word...)
	}
	return b
}
