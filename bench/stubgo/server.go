package main

// A minimal HTTP/1.1 server, in place of net/http's, driven by one epoll(7) loop in one
// goroutine. net/http's server spends, per request, a goroutine hand-off, header maps, a Request,
// a ResponseWriter and a chunked writer; and any server on Go's network poller is woken from idle
// by every request behind a gateway (a few thousand a second, each on its own): the poller's
// thread, the connection's goroutine, and the runtime's monitor thread (sysmon), which parks
// whenever every P is idle and is woken by the next system call. Here the loop waits in
// epoll_pwait as a raw system call (its P never looks idle, sysmon checks every 10 ms), reads
// into a buffer each connection keeps, and answers a request with one write (ADR 0002; the
// load generator does the same).
//
// It takes what the gateway, the SDKs and the benches send: keep-alive and pipelined requests
// (answered in order), HTTP/1.0 (closed after each answer unless it asks for keep-alive),
// `Connection: close`, bodies by Content-Length or chunked (at most maxBody; a larger one is
// answered and the connection closed). A request it cannot read gets 400 (431 for a head over
// maxHead) and the connection closed, as net/http did. Answers held by the token delay are
// scheduled (pause): the loop writes each piece when it is due, and a client that leaves (end
// of stream or reset on its connection) ends them.

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

const (
	maxHead    = 64 << 10
	readSize   = 16 << 10 // the buffer a connection starts with
	timeFormat = "Mon, 02 Jan 2006 15:04:05 GMT"
	linger     = 500 * time.Millisecond
)

var (
	errIncomplete = errors.New("incomplete request")
	errMalformed  = errors.New("malformed request")
	errHeadTooBig = errors.New("request head too large")
)

// request is what the stub reads of one HTTP request. Its slices point into the connection's
// buffer: valid while it is being answered.
type request struct {
	method, path []byte
	auth         []byte // the Authorization header's value
	body         []byte
	tooLarge     bool // the body was over maxBody and was not read
	close        bool // the connection ends after this answer
}

// connection is one client's: its read buffer (unread bytes buf[start:end]) and its answers,
// out[:sent] written, out[sent:ready] to write now, out[ready:] held until its pauses pass.
type connection struct {
	fd         int
	buf        []byte
	start, end int
	need       int // bytes the next request takes at least, when known
	out, frame []byte
	sent       int
	ready      int
	pauses     []pause
	due        time.Time // when out[ready:] starts to be released
	running    int       // requests counted in the stub's running gauge until their answer ends
	eof        bool      // the client sent its last byte
	closing    bool      // close once out is written
	blocked    bool      // the socket took only part of out: waiting for EPOLLOUT
	draining   time.Time // closing: the write side is shut; input dropped until then
	dateSecond int64
	date       []byte
}

// pause holds the bytes of out from at on for wait after those before them were released.
type pause struct {
	at   int
	wait time.Duration
}

type server struct {
	s     *stub
	epfd  int
	lfd   int
	conns []*connection // by file descriptor
	timed map[*connection]struct{}
}

// serve listens on 127.0.0.1:port and answers until a system call fails.
func (s *stub) serve(port int) error {
	sv, err := s.listen(port)
	if err != nil {
		return &net.OpError{Op: "listen", Net: "tcp", Err: err}
	}
	return sv.run()
}

func (s *stub) listen(port int) (*server, error) {
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	sv := &server{s: s, lfd: lfd, timed: map[*connection]struct{}{}}
	for _, step := range []func() error{
		func() error { return syscall.SetsockoptInt(lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) },
		func() error {
			return syscall.Bind(lfd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
		},
		func() error { return syscall.Listen(lfd, 1024) },
		func() (err error) { sv.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); return err },
		func() error { return sv.watch(lfd, syscall.EPOLLIN, syscall.EPOLL_CTL_ADD) },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return sv, nil
}

// run is the loop: wait for events or the next timer, answer, release what is due.
func (sv *server) run() error {
	events := make([]syscall.EpollEvent, 128)
	for {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(sv.epfd),
			uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(sv.timeout()), 0, 0)
		if errno != 0 && errno != syscall.EINTR { // EINTR: a signal, the runtime's preemption among them
			return errno
		}
		if errno == 0 {
			for _, event := range events[:n] {
				sv.event(int(event.Fd), event.Events)
			}
		}
		sv.timers(time.Now())
	}
}

func (sv *server) watch(fd int, events uint32, op int) error {
	event := syscall.EpollEvent{Events: events, Fd: int32(fd)}
	return syscall.EpollCtl(sv.epfd, op, fd, &event)
}

// timeout is how long epoll may wait: until the next held answer or lingering close is due.
func (sv *server) timeout() int {
	if len(sv.timed) == 0 {
		return -1
	}
	next := time.Duration(1 << 62)
	now := time.Now()
	for c := range sv.timed {
		next = min(next, c.wakeAt().Sub(now))
	}
	return int(max(0, (next+time.Millisecond-1)/time.Millisecond))
}

func (c *connection) wakeAt() time.Time {
	if !c.draining.IsZero() {
		return c.draining
	}
	return c.due
}

func (sv *server) event(fd int, events uint32) {
	if fd == sv.lfd {
		sv.accept()
		return
	}
	if fd >= len(sv.conns) || sv.conns[fd] == nil {
		return
	}
	c := sv.conns[fd]
	if events&syscall.EPOLLOUT != 0 {
		sv.flush(c)
	}
	if events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 && sv.conns[fd] == c {
		sv.readable(c)
	}
}

func (sv *server) accept() {
	for {
		fd, _, err := syscall.Accept4(sv.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: none left; anything else: the next event tries again
		}
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if err := sv.watch(fd, syscall.EPOLLIN|syscall.EPOLLRDHUP, syscall.EPOLL_CTL_ADD); err != nil {
			syscall.Close(fd)
			continue
		}
		for fd >= len(sv.conns) {
			sv.conns = append(sv.conns, nil)
		}
		sv.conns[fd] = &connection{fd: fd, buf: make([]byte, readSize)}
	}
}

// readable reads what the client sent, then answers every whole request it holds.
func (sv *server) readable(c *connection) {
	if c.start == c.end {
		c.start, c.end = 0, 0
	}
	c.room()
	n, err := syscall.Read(c.fd, c.buf[c.end:])
	switch {
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR):
		return
	case err != nil || n == 0:
		c.eof = true
		if err != nil || c.pending() || !c.draining.IsZero() {
			sv.drop(c) // reset, or gone while its answer was held, or lingering done
			return
		}
	default:
		if !c.draining.IsZero() {
			c.start, c.end = 0, 0 // dropped: nothing more is answered
			return
		}
		c.end += n
	}
	sv.answer(c)
}

// room makes space to read into: the unread bytes moved to the front, the buffer grown to hold
// the next request when its size is known.
func (c *connection) room() {
	if c.start > 0 && (c.end == len(c.buf) || c.need > len(c.buf)-c.start) {
		c.end = copy(c.buf, c.buf[c.start:c.end])
		c.start = 0
	}
	if c.need > len(c.buf) || c.end == len(c.buf) {
		grown := make([]byte, max(c.need, 2*len(c.buf)))
		copy(grown, c.buf[:c.end])
		c.buf = grown
	}
}

// answer answers the whole requests read, in order, while no answer is held.
func (sv *server) answer(c *connection) {
	for !c.pending() && !c.closing {
		req, used, need, err := parse(c.buf[c.start:c.end])
		switch {
		case errors.Is(err, errIncomplete):
			c.need = need
			if c.eof {
				c.closing = true
			}
		case errors.Is(err, errMalformed):
			c.reply(400, textPlain, []byte("400 Bad Request"), true)
		case errors.Is(err, errHeadTooBig):
			c.reply(431, textPlain, []byte("431 Request Header Fields Too Large"), true)
		default:
			c.start += used
			c.need = 0
			sv.s.route(c, &req)
			c.closing = c.closing || req.close
			if c.pending() {
				sv.timed[c] = struct{}{}
			} else {
				sv.s.running.Add(int64(-c.running))
				c.running = 0
			}
			continue
		}
		break
	}
	sv.flush(c)
}

// pending: part of an answer is held by a pause.
func (c *connection) pending() bool { return c.ready < len(c.out) }

// timers releases held answers that are due and ends lingering closes that are over.
func (sv *server) timers(now time.Time) {
	for c := range sv.timed {
		if now.Before(c.wakeAt()) {
			continue
		}
		if !c.draining.IsZero() {
			sv.drop(c)
			continue
		}
		c.release(now)
		if !c.pending() {
			delete(sv.timed, c)
			sv.s.running.Add(int64(-c.running))
			c.running = 0
		}
		sv.flush(c)
		if !c.pending() && sv.conns[c.fd] == c {
			sv.answer(c) // requests that came while the answer was held
		}
	}
}

// release lets out the bytes the first pause held; the next pause, if any, counts from now (a
// token frame waits its delay after the one before was written, as with net/http's flushes).
func (c *connection) release(now time.Time) {
	c.pauses = c.pauses[1:]
	if len(c.pauses) > 0 {
		c.due = now.Add(c.pauses[0].wait)
	}
	c.done()
}

// pause holds what is appended to the answer from now on for d after what came before.
func (c *connection) pause(d time.Duration) {
	if d <= 0 {
		return
	}
	if len(c.pauses) == 0 {
		c.due = time.Now().Add(d)
	}
	c.pauses = append(c.pauses, pause{at: len(c.out), wait: d})
}

// flush writes what is ready; what the socket does not take waits for EPOLLOUT.
func (sv *server) flush(c *connection) {
	for c.sent < c.ready {
		n, err := syscall.Write(c.fd, c.out[c.sent:c.ready])
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			if !c.blocked {
				c.blocked = true
				sv.watch(c.fd, syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLOUT, syscall.EPOLL_CTL_MOD)
			}
			return
		}
		if err != nil {
			sv.drop(c)
			return
		}
		c.sent += n
	}
	if c.blocked {
		c.blocked = false
		sv.watch(c.fd, syscall.EPOLLIN|syscall.EPOLLRDHUP, syscall.EPOLL_CTL_MOD)
	}
	if !c.pending() {
		c.out, c.sent, c.ready = c.out[:0], 0, 0
		if c.closing && c.draining.IsZero() {
			sv.linger(c)
		}
	}
}

// linger closes as net/http did after an answer it closes on: the write side first, then what
// the client still sends (a body not read) is dropped for up to half a second, so that the
// answer is not lost to a reset from unread data.
func (sv *server) linger(c *connection) {
	if c.eof {
		sv.drop(c)
		return
	}
	syscall.Shutdown(c.fd, syscall.SHUT_WR)
	sv.watch(c.fd, syscall.EPOLLIN|syscall.EPOLLRDHUP, syscall.EPOLL_CTL_MOD)
	c.draining = time.Now().Add(linger)
	sv.timed[c] = struct{}{}
}

// drop closes the connection; an answer it held ends there (the client left).
func (sv *server) drop(c *connection) {
	if sv.conns[c.fd] != c {
		return
	}
	sv.s.running.Add(int64(-c.running))
	c.running = 0
	delete(sv.timed, c)
	sv.conns[c.fd] = nil
	syscall.Close(c.fd) // also out of the epoll set
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
	b := append(c.out, "HTTP/1.1 "...)
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

// reply adds a whole answer with its Content-Length; closing ends the connection after it.
func (c *connection) reply(status int, contentType string, body []byte, closing bool) {
	c.head(status, contentType, closing)
	c.out = append(c.out, "Content-Length: "...)
	c.out = strconv.AppendInt(c.out, int64(len(body)), 10)
	c.out = append(c.out, "\r\n\r\n"...)
	c.out = append(c.out, body...)
	c.closing = c.closing || closing
	c.done()
}

// done marks what was added so far ready to write, up to the first pause.
func (c *connection) done() {
	c.ready = len(c.out)
	if len(c.pauses) > 0 {
		c.ready = c.pauses[0].at
	}
}

// chunked starts an answer sent in chunks.
func (c *connection) chunked(contentType, cache string, closing bool) {
	c.head(200, contentType, closing)
	c.out = append(c.out, "Cache-Control: "...)
	c.out = append(c.out, cache...)
	c.out = append(c.out, "\r\nTransfer-Encoding: chunked\r\n\r\n"...)
}

// chunk adds one chunk; last adds the closing empty chunk too.
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
	c.done()
}
