package main

// A minimal HTTP/1.1 server, in place of net/http's: one goroutine per connection reads into a
// buffer it keeps and answers each request with one write. net/http's server spends, per request,
// a goroutine hand-off, header maps, a Request, a ResponseWriter and a chunked writer; on 2 cores
// shared with the gateway under test that was a third of the stub's CPU (ADR 0002, session 9).
//
// It takes what the gateway, the SDKs and the benches send: keep-alive and pipelined requests,
// HTTP/1.0 (closed after each answer unless it asks for keep-alive), `Connection: close`, bodies
// by Content-Length or chunked (at most maxBody; a larger one is answered and the connection
// closed). A request it cannot read gets 400 (431 for a head over maxHead) and the connection
// closed, as net/http did.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

const (
	maxHead    = 64 << 10
	readSize   = 16 << 10 // the buffer a connection starts with
	timeFormat = "Mon, 02 Jan 2006 15:04:05 GMT"
)

var (
	errIncomplete = errors.New("incomplete request")
	errMalformed  = errors.New("malformed request")
	errHeadTooBig = errors.New("request head too large")
	aLongTimeAgo  = time.Unix(1, 0)
)

// request is what the stub reads of one HTTP request. Its slices point into the connection's
// buffer: valid until the next request is read.
type request struct {
	method, path []byte
	auth         []byte // the Authorization header's value
	body         []byte
	tooLarge     bool // the body was over maxBody and was not read
	close        bool // the connection ends after this answer
}

// connection is one client's: its read buffer (unread bytes buf[start:end]), the answer being
// written and, while a paced answer waits, the read that notices the client leaving.
type connection struct {
	net.Conn
	buf        []byte
	start, end int
	out, frame []byte // reused for every answer
	dateSecond int64
	date       []byte
	watching   bool
	watched    chan readResult
	spare      []byte // the watching read's buffer
	gone       bool   // the client left or the connection failed: no more answers
}

type readResult struct {
	n   int
	err error
}

func (s *stub) serve(listener net.Listener) error {
	for {
		raw, err := listener.Accept()
		if err != nil {
			var transient interface{ Temporary() bool }
			if errors.As(err, &transient) && transient.Temporary() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		go s.connection(raw)
	}
}

func (s *stub) connection(raw net.Conn) {
	c := &connection{Conn: raw, buf: make([]byte, readSize)}
	defer c.close()
	for !c.gone {
		req, err := c.next()
		switch {
		case errors.Is(err, errMalformed):
			c.reply(400, textPlain, []byte("400 Bad Request"), true)
			return
		case errors.Is(err, errHeadTooBig):
			c.reply(431, textPlain, []byte("431 Request Header Fields Too Large"), true)
			return
		case err != nil:
			return
		}
		s.route(c, &req)
		c.stopWatching()
		if req.close {
			return
		}
	}
}

// close ends the connection as net/http did after an answer it closes on: the write side first,
// then what the client still sends (a body not read) is read and dropped for up to half a
// second, so that the answer is not lost to a reset from unread data.
func (c *connection) close() {
	if tcp, ok := c.Conn.(*net.TCPConn); ok && !c.gone {
		tcp.CloseWrite()
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		io.CopyN(io.Discard, c.Conn, 4*maxBody)
	}
	c.Conn.Close()
}

// next parses the next request from the buffer, reading more until it is whole.
func (c *connection) next() (request, error) {
	if c.start == c.end {
		c.start, c.end = 0, 0
	}
	for {
		req, used, need, err := parse(c.buf[c.start:c.end])
		if err == nil {
			c.start += used
			return req, nil
		}
		if !errors.Is(err, errIncomplete) {
			return req, err
		}
		if err := c.fill(need); err != nil {
			return request{}, err
		}
	}
}

// fill reads at least one more byte, making room for need unread bytes first.
func (c *connection) fill(need int) error {
	if c.start > 0 {
		c.end = copy(c.buf, c.buf[c.start:c.end])
		c.start = 0
	}
	if need > len(c.buf) || c.end == len(c.buf) {
		grown := make([]byte, max(need, 2*len(c.buf)))
		copy(grown, c.buf[:c.end])
		c.buf = grown
	}
	n, err := c.Read(c.buf[c.end:])
	c.end += n
	if n > 0 {
		return nil
	}
	return err
}

// parse reads one request from data: the request, the bytes it took, and when data holds only
// part of it (errIncomplete), how many bytes at least the whole takes.
func parse(data []byte) (request, int, int, error) {
	var req request
	line, rest, ok := cutLine(data)
	if !ok {
		return req, 0, len(data) + 1, incomplete(len(data))
	}
	method, target, proto, ok := requestLine(line)
	if !ok {
		return req, 0, 0, errMalformed
	}
	path, _, _ := bytes.Cut(target, []byte("?"))
	req.method, req.path = method, path
	req.close = string(proto) == "HTTP/1.0"
	length, chunked := int64(0), false
	for {
		line, rest, ok = cutLine(rest)
		if !ok {
			return req, 0, len(data) + 1, incomplete(len(data))
		}
		if len(line) == 0 {
			break
		}
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found || len(name) == 0 || name[0] == ' ' || name[0] == '\t' {
			return req, 0, 0, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (length > 0 && n != length) {
				return req, 0, 0, errMalformed
			}
			length = n
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			if !bytes.EqualFold(value, []byte("chunked")) {
				return req, 0, 0, errMalformed
			}
			chunked = true
		case bytes.EqualFold(name, []byte("connection")):
			req.close = connectionCloses(value, req.close)
		case bytes.EqualFold(name, []byte("authorization")):
			req.auth = value
		}
	}
	headLen := len(data) - len(rest)
	if chunked {
		return dechunk(req, data, headLen)
	}
	if length > maxBody {
		req.tooLarge, req.close = true, true
		return req, headLen, 0, nil
	}
	total := headLen + int(length)
	if len(data) < total {
		return req, 0, total, errIncomplete
	}
	req.body = data[headLen:total]
	return req, total, 0, nil
}

func incomplete(have int) error {
	if have > maxHead {
		return errHeadTooBig
	}
	return errIncomplete
}

// cutLine splits off the first line (without its CRLF or LF); false when there is no whole line.
func cutLine(data []byte) ([]byte, []byte, bool) {
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		return nil, data, false
	}
	return bytes.TrimSuffix(data[:i], []byte("\r")), data[i+1:], true
}

func requestLine(line []byte) ([]byte, []byte, []byte, bool) {
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	target, proto, ok2 := bytes.Cut(rest, []byte(" "))
	ok := ok1 && ok2 && len(method) > 0 && len(target) > 0 && target[0] == '/' &&
		(string(proto) == "HTTP/1.1" || string(proto) == "HTTP/1.0")
	return method, target, proto, ok
}

func connectionCloses(value []byte, closing bool) bool {
	for _, option := range bytes.Split(value, []byte(",")) {
		option = bytes.TrimSpace(option)
		if bytes.EqualFold(option, []byte("close")) {
			return true
		}
		if bytes.EqualFold(option, []byte("keep-alive")) {
			closing = false
		}
	}
	return closing
}

// dechunk decodes a chunked body, after the head, into a new slice (chunked requests are rare:
// neither the gateway nor the SDKs send them). data is left as it was, to be parsed again when
// the body is not whole yet.
func dechunk(req request, data []byte, at int) (request, int, int, error) {
	var body []byte
	for {
		line, rest, ok := cutLine(data[at:])
		if !ok {
			return req, 0, len(data) + 1, chunksIncomplete(len(data))
		}
		digits, _, _ := bytes.Cut(line, []byte(";"))
		size, err := strconv.ParseInt(string(bytes.TrimSpace(digits)), 16, 64)
		if err != nil || size < 0 {
			return req, 0, 0, errMalformed
		}
		if int64(len(body))+size > maxBody {
			req.tooLarge, req.close = true, true
			return req, len(data), 0, nil
		}
		at = len(data) - len(rest)
		if size == 0 {
			return trailers(req, data, at, body)
		}
		end := at + int(size)
		if len(data) < end+2 {
			return req, 0, end + 2, chunksIncomplete(len(data))
		}
		if string(data[end:end+2]) != "\r\n" {
			return req, 0, 0, errMalformed
		}
		body = append(body, data[at:end]...)
		at = end + 2
	}
}

// chunksIncomplete bounds what a chunked body may hold unread: size lines or trailers without end
// are malformed.
func chunksIncomplete(have int) error {
	if have > 2*maxHead+2*maxBody {
		return errMalformed
	}
	return errIncomplete
}

func trailers(req request, data []byte, at int, body []byte) (request, int, int, error) {
	for {
		line, rest, ok := cutLine(data[at:])
		if !ok {
			return req, 0, len(data) + 1, chunksIncomplete(len(data))
		}
		at = len(data) - len(rest)
		if len(line) == 0 {
			req.body = body
			return req, at, 0, nil
		}
	}
}

const textPlain = "text/plain; charset=utf-8"

var statusText = map[int]string{
	200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
	405: "Method Not Allowed", 431: "Request Header Fields Too Large",
}

// head starts an answer in c.out: status line, Date, Content-Type, Connection: close if closing.
func (c *connection) head(status int, contentType string, closing bool) {
	now := time.Now()
	if second := now.Unix(); second != c.dateSecond || c.date == nil {
		c.dateSecond, c.date = second, now.UTC().AppendFormat(c.date[:0], timeFormat)
	}
	b := append(c.out[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, statusText[status]...)
	b = append(b, "\r\nDate: "...)
	b = append(b, c.date...)
	if contentType != "" {
		b = append(b, "\r\nContent-Type: "...)
		b = append(b, contentType...)
	}
	if closing {
		b = append(b, "\r\nConnection: close"...)
	}
	c.out = append(b, "\r\n"...)
}

// reply writes a whole answer with its Content-Length, in one write.
func (c *connection) reply(status int, contentType string, body []byte, closing bool) {
	c.head(status, contentType, closing)
	c.out = append(c.out, "Content-Length: "...)
	c.out = strconv.AppendInt(c.out, int64(len(body)), 10)
	c.out = append(c.out, "\r\n\r\n"...)
	c.out = append(c.out, body...)
	c.send()
}

// chunked starts an answer sent in chunks (its head, not yet written).
func (c *connection) chunked(contentType, cache string, closing bool) {
	c.head(200, contentType, closing)
	c.out = append(c.out, "Cache-Control: "...)
	c.out = append(c.out, cache...)
	c.out = append(c.out, "\r\nTransfer-Encoding: chunked\r\n\r\n"...)
}

// chunk adds one chunk to what c.out holds; last adds the closing empty chunk too.
func (c *connection) chunk(data []byte, last bool) {
	if len(data) > 0 {
		c.out = strconv.AppendInt(c.out, int64(len(data)), 16)
		c.out = append(c.out, "\r\n"...)
		c.out = append(c.out, data...)
		c.out = append(c.out, "\r\n"...)
	}
	if last {
		c.out = append(c.out, "0\r\n\r\n"...)
	}
}

// send writes c.out; a failed write ends the connection.
func (c *connection) send() bool {
	if c.gone {
		return false
	}
	if _, err := c.Write(c.out); err != nil {
		c.gone = true
	}
	c.out = c.out[:0]
	return !c.gone
}

// wait sleeps d, or less when the client leaves; false when it has. While it waits, a read
// watches the connection (as net/http's background read did): its end (EOF, a reset) is the
// client leaving; bytes it reads (a pipelined request) are kept for the next request. The
// request being answered must not be read after its first wait (its bytes may move).
func (c *connection) wait(d time.Duration) bool {
	if c.gone {
		return false
	}
	if d <= 0 {
		return true
	}
	if !c.watching {
		c.watch()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return true
		case got := <-c.watched:
			c.watching = false
			if !c.keep(got) {
				return false
			}
			c.watch()
		}
	}
}

func (c *connection) watch() {
	if c.watched == nil {
		c.watched, c.spare = make(chan readResult, 1), make([]byte, 4096)
	}
	c.watching = true
	go func() {
		n, err := c.Read(c.spare)
		c.watched <- readResult{n, err}
	}()
}

// keep saves what the watching read got; false when the connection ended.
func (c *connection) keep(got readResult) bool {
	if got.n > 0 {
		c.buf = append(c.buf[:c.end], c.spare[:got.n]...)
		c.end = len(c.buf)
		c.buf = c.buf[:cap(c.buf)]
	}
	if got.err != nil && !errors.Is(got.err, os.ErrDeadlineExceeded) {
		c.gone = true
	}
	return !c.gone
}

// stopWatching ends the watching read, if any, once an answer is written.
func (c *connection) stopWatching() {
	if !c.watching {
		return
	}
	c.SetReadDeadline(aLongTimeAgo)
	got := <-c.watched
	c.watching = false
	c.SetReadDeadline(time.Time{})
	c.keep(got)
}
