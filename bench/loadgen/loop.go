package main

// The connections are driven by one event loop on epoll(7), in one goroutine, rather than a
// goroutine each on Go's network poller. On the poller every answer behind a gateway (a few
// thousand a second, each on its own) woke the program from idle: the poller's thread, a hand-off
// to the goroutine, and the runtime's monitor thread (sysmon), which parks whenever every P is
// idle and is woken again by the next system call, then sleeps 20 us, finds nothing and parks:
// that thread alone was 40% of the generator's CPU (ADR 0002). Here the loop waits in
// epoll_pwait as a raw system call, so its P never looks idle to the runtime, sysmon settles to a
// check every 10 ms, and an answer costs one wake-up, a read and the next request's write.

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
	"unsafe"
)

// client is one keep-alive connection: fd -1 until dialled, and again after an error or a close.
type client struct {
	fd      int
	buf     []byte // received since the last whole answer: buf[:n]
	n       int
	start   time.Time // when the request in flight was written; zero when none is
	frameAt time.Time // mode first: when its first frame had come
	retryAt time.Time // after a transport error: no dial before this
}

type loop struct {
	t       *target
	epfd    int
	addr    syscall.Sockaddr
	family  int
	clients []*client
	events  []syscall.EpollEvent
	tallies []tally
}

func newLoop(t *target, concurrency int) (*loop, error) {
	tcp, err := net.ResolveTCPAddr("tcp", t.address)
	if err != nil {
		return nil, err
	}
	l := &loop{t: t, events: make([]syscall.EpollEvent, concurrency)}
	if ip4 := tcp.IP.To4(); ip4 != nil {
		l.addr, l.family = &syscall.SockaddrInet4{Port: tcp.Port, Addr: [4]byte(ip4)}, syscall.AF_INET
	} else {
		l.addr, l.family = &syscall.SockaddrInet6{Port: tcp.Port, Addr: [16]byte(tcp.IP.To16())}, syscall.AF_INET6
	}
	if l.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	for range concurrency {
		l.clients = append(l.clients, &client{fd: -1, buf: make([]byte, 64<<10)})
	}
	return l, nil
}

// phase runs the closed loop for seconds: each connection sends its next request as soon as its
// last answer is whole, until the deadline; then the answers in flight are waited for.
func (l *loop) phase(seconds float64) ([]tally, time.Duration) {
	l.tallies = make([]tally, len(l.clients))
	start := time.Now()
	until := start.Add(time.Duration(seconds * float64(time.Second)))
	for now := start; ; now = time.Now() {
		waiting := false
		for i, c := range l.clients {
			if c.start.IsZero() && now.Before(until) && !now.Before(c.retryAt) {
				l.send(i, now)
			}
			if !c.start.IsZero() && now.Sub(c.start) > requestTimeout {
				l.fail(i, now)
			}
			waiting = waiting || !c.start.IsZero() || now.Before(until)
		}
		if !waiting {
			return l.tallies, time.Since(start)
		}
		l.wait(10)
	}
}

// wait takes the events of up to timeout milliseconds and reads what they announce.
func (l *loop) wait(timeout int) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(l.epfd),
		uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), uintptr(timeout), 0, 0)
	if errno != 0 { // EINTR: a signal (the runtime's preemption among them); the loop goes on
		return
	}
	now := time.Now()
	for _, event := range l.events[:n] {
		l.readable(int(event.Fd), now)
	}
}

// readable reads what connection i received and takes its answer when whole.
func (l *loop) readable(i int, now time.Time) {
	c := l.clients[i]
	if c.fd < 0 {
		return
	}
	if c.n == len(c.buf) {
		c.buf = append(c.buf, make([]byte, len(c.buf))...)
	}
	k, err := syscall.Read(c.fd, c.buf[c.n:])
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return
	}
	eof := k == 0 && err == nil
	if err != nil || c.start.IsZero() { // an error, or the server closing an idle connection
		l.drop(c)
		if err != nil || !eof {
			l.fail(i, now)
		}
		return
	}
	c.n += max(k, 0)
	var scan *frameScan
	if l.t.first && c.frameAt.IsZero() {
		scan = &frameScan{}
	}
	got, err := parseAnswer(c.buf[:c.n], eof, scan)
	if scan != nil && scan.found {
		c.frameAt = now
	}
	switch {
	case errors.Is(err, errIncomplete) && !eof:
		return
	case errors.Is(err, errIncomplete):
		l.fail(i, now) // closed mid-answer
		return
	case err != nil:
		l.fail(i, now)
		return
	}
	l.done(i, got, now)
}

// done records a whole answer and keeps what came after it (nothing, in a closed loop).
func (l *loop) done(i int, got answer, now time.Time) {
	c := l.clients[i]
	out := &l.tallies[i]
	switch {
	case got.status != 200:
		out.errors++
	case l.t.first && c.frameAt.IsZero():
		out.errors++ // the stream ended before its first frame
	case l.t.first:
		out.latencies = append(out.latencies, c.frameAt.Sub(c.start))
	default:
		out.latencies = append(out.latencies, now.Sub(c.start))
	}
	c.n = copy(c.buf, c.buf[got.used:c.n])
	c.start, c.frameAt = time.Time{}, time.Time{}
	if got.closing {
		l.drop(c)
	}
}

// send writes connection i's next request, dialling first when it has none.
func (l *loop) send(i int, now time.Time) {
	c := l.clients[i]
	if c.fd < 0 {
		if err := l.dial(i); err != nil {
			l.fail(i, now)
			return
		}
	}
	c.start = now
	request := l.t.request
	for len(request) > 0 {
		k, err := syscall.Write(c.fd, request)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			l.fail(i, now)
			return
		}
		request = request[k:]
	}
}

func (l *loop) dial(i int) error {
	c := l.clients[i]
	fd, err := syscall.Socket(l.family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	// Blocking, as net.DialTimeout's 10 s was: a connect on loopback is immediate or refused.
	tv := syscall.Timeval{Sec: 10}
	syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv)
	if err := connect(fd, l.addr); err != nil {
		syscall.Close(fd)
		return err
	}
	event := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(i)} // Fd: the client's index
	for _, step := range []error{
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1), // as Go's dialer
		syscall.SetNonblock(fd, true),
		syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, fd, &event),
	} {
		if step != nil {
			syscall.Close(fd)
			return fmt.Errorf("setting up a connection: %w", step)
		}
	}
	c.fd, c.n = fd, 0
	return nil
}

// connect is a blocking connect(2) that a signal does not fail: with a send timeout set, the
// kernel does not restart it after a signal handler, and the runtime's preemption signal comes
// every 10 ms while the loop runs (a full accept queue makes a connect wait a second for its SYN
// to be sent again). Called again, it goes on waiting for the same connection.
func connect(fd int, addr syscall.Sockaddr) error {
	err := syscall.Connect(fd, addr)
	for errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EALREADY) {
		err = syscall.Connect(fd, addr)
	}
	if errors.Is(err, syscall.EISCONN) {
		return nil
	}
	return err
}

// fail counts a transport error (or a malformed answer) on connection i and closes it; the next
// request dials again, after 10 ms, so that a refused connection does not spin a core.
func (l *loop) fail(i int, now time.Time) {
	c := l.clients[i]
	l.tallies[i].errors++
	l.drop(c)
	c.start, c.frameAt, c.retryAt = time.Time{}, time.Time{}, now.Add(10*time.Millisecond)
}

func (l *loop) drop(c *client) {
	if c.fd >= 0 {
		syscall.Close(c.fd) // closing also takes it out of the epoll set
		c.fd, c.n = -1, 0
	}
}
