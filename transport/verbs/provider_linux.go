//go:build linux && cgo && !noverbs

package verbs

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <errno.h>
#include <sys/socket.h>
#include "lwverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/sirupsen/logrus"
)

// Built reports whether the real provider is compiled in.
const Built = true

// Provider is the verbs provider. Its zero value is not usable; call New.
type Provider struct {
	opts Options
	log  logrus.FieldLogger

	mu      sync.Mutex
	domains map[*C.struct_ibv_context]*domain
}

var _ transport.Provider = (*Provider)(nil)

// New returns the verbs provider. Nothing is loaded until first use.
func New(opts Options) *Provider {
	opts = opts.withDefaults()
	return &Provider{opts: opts, log: quietlog.Or(opts.Logger).WithField("provider", Name), domains: map[*C.struct_ibv_context]*domain{}}
}

// Name is "verbs".
func (p *Provider) Name() string { return Name }

var (
	loadOnce sync.Once
	loadErr  error
)

// load dlopens rdma-core's libraries once per process.
func load() error {
	loadOnce.Do(func() {
		if C.lwv_load() != 0 {
			loadErr = fmt.Errorf("verbs: rdma-core runtime libraries not loadable (install libibverbs1, librdmacm1, ibverbs-providers): %s",
				C.GoString(C.lwv_load_error()))
		}
	})
	return loadErr
}

// Available reports nil when the libraries load and at least one RDMA
// device exists and rdma_cm can be used; otherwise it says which of these
// fails and what that usually means.
func (p *Provider) Available() error {
	if err := load(); err != nil {
		return err
	}
	// libibverbs answers ENOSYS when the kernel has no RDMA support at all;
	// say what that means rather than the errno.
	if n := C.lwv_device_count(); n <= 0 {
		if _, err := os.Stat("/sys/class/infiniband"); err != nil {
			return errors.New("verbs: no RDMA devices: /sys/class/infiniband does not exist (this kernel has no RDMA support loaded)")
		}
		if n < 0 {
			return fmt.Errorf("verbs: no RDMA devices: ibv_get_device_list: %w", syscall.Errno(-n))
		}
		return errors.New("verbs: no RDMA devices in /sys/class/infiniband (no RDMA NIC driver bound; for Soft-RoCE: rdma link add rxe0 type rxe netdev <dev>)")
	}
	if _, err := os.Stat("/dev/infiniband/rdma_cm"); err != nil {
		return errors.New("verbs: /dev/infiniband/rdma_cm missing (load the rdma_ucm module)")
	}
	return nil
}

// Close releases the protection domains. Every connection and region must
// be gone.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first error
	for ctx, d := range p.domains {
		d.stopEvents()
		if r := C.lwv_dealloc_pd(d.pd); r != 0 && first == nil {
			first = fmt.Errorf("verbs: ibv_dealloc_pd on %s: %w", d.dev, syscall.Errno(r))
		}
		delete(p.domains, ctx)
	}
	return first
}

// domainFor returns the protection domain of a device context, allocating
// it on first use.
func (p *Provider) domainFor(ctx *C.struct_ibv_context) (*domain, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.domains[ctx]; d != nil {
		return d, nil
	}
	pd, err := C.lwv_alloc_pd(ctx)
	if pd == nil {
		return nil, fmt.Errorf("verbs: ibv_alloc_pd: %w", errnoOr(err))
	}
	d := &domain{p: p, ctx: ctx, pd: pd, dev: C.GoString(C.lwv_context_name(ctx)), srqs: map[*C.struct_ibv_srq]*srq{}}
	p.domains[ctx] = d
	return d, nil
}

func errnoOr(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}

// sockaddr splits an "ip:port" into what the C layer takes.
func sockaddr(addr string) (family C.int, ip [16]byte, port uint16, err error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, ip, 0, err
	}
	var a net.IP
	if host == "" {
		a = net.IPv4zero
	} else if a = net.ParseIP(host); a == nil {
		return 0, ip, 0, fmt.Errorf("verbs: %q is not an IP address", host)
	}
	pn, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return 0, ip, 0, fmt.Errorf("verbs: bad port %q", ps)
	}
	if v4 := a.To4(); v4 != nil {
		copy(ip[:], v4)
		return C.AF_INET, ip, uint16(pn), nil
	}
	copy(ip[:], a.To16())
	return C.AF_INET6, ip, uint16(pn), nil
}

// idAddr formats the local (which 0) or peer (which 1) address of an id.
func idAddr(id *C.struct_rdma_cm_id, which C.int) string {
	var ip [16]byte
	var port C.uint16_t
	switch C.lwv_addr(id, which, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &port) {
	case C.AF_INET:
		return net.JoinHostPort(net.IP(ip[:4]).String(), strconv.Itoa(int(port)))
	case C.AF_INET6:
		return net.JoinHostPort(net.IP(ip[:]).String(), strconv.Itoa(int(port)))
	}
	return "?"
}

// cmEvent is an rdma_cm event, already acknowledged.
type cmEvent struct {
	id     *C.struct_rdma_cm_id
	kind   C.int
	status int
}

func (e cmEvent) String() string {
	s := C.GoString(C.lwv_event_str(e.kind))
	switch {
	case e.status < 0:
		s += " (" + syscall.Errno(-e.status).Error() + ")"
	case e.status > 0 && e.kind == C.RDMA_CM_EVENT_REJECTED:
		s += fmt.Sprintf(" (IB CM reject reason %d; 8 is no listener)", e.status)
	case e.status > 0:
		s += fmt.Sprintf(" (status %d)", e.status)
	}
	return s
}

// eventChannel is an rdma_cm event channel read by one goroutine through
// Go's poller (the channel's fd is non-blocking; a dup of it is registered
// with the poller so closing it wakes the reader without touching the
// channel).
type eventChannel struct {
	ch   *C.struct_rdma_event_channel
	f    *os.File
	done chan struct{}
}

func newEventChannel() (*eventChannel, error) {
	ch, err := C.lwv_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("verbs: rdma_create_event_channel: %w", errnoOr(err))
	}
	fd, err := syscall.Dup(int(C.lwv_event_channel_fd(ch)))
	if err != nil {
		C.lwv_destroy_event_channel(ch)
		return nil, fmt.Errorf("verbs: dup event channel: %w", err)
	}
	syscall.CloseOnExec(fd)
	return &eventChannel{ch: ch, f: os.NewFile(uintptr(fd), "rdma_cm"), done: make(chan struct{})}, nil
}

// run delivers events to handle until stop.
func (e *eventChannel) run(handle func(cmEvent)) {
	defer close(e.done)
	var ev C.struct_lwv_cm_event
	onReadable(e.f, func() C.int { return C.lwv_get_cm_event(e.ch, &ev) }, func() {
		handle(cmEvent{id: ev.id, kind: ev.event, status: int(ev.status)})
	})
}

// onReadable takes, each time f's non-blocking descriptor has something
// (Go's poller waits for it, no OS thread waits in C), one item with get,
// which returns -EAGAIN when nothing is pending, and passes it to use;
// it returns when f is closed or get fails.
func onReadable(f *os.File, get func() C.int, use func()) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for {
		var r C.int
		err := rc.Read(func(uintptr) bool {
			r = get()
			return r != -C.EAGAIN
		})
		if err != nil || r < 0 {
			return
		}
		use()
	}
}

// stop ends run (if started) and waits for it.
func (e *eventChannel) stop(started bool) {
	e.f.Close()
	if started {
		<-e.done
	}
}

// destroy frees the channel; every id on it must be destroyed.
func (e *eventChannel) destroy() { C.lwv_destroy_event_channel(e.ch) }

// Listen binds addr on the RDMA device that owns it (or every device for
// the unspecified address) and listens.
func (p *Provider) Listen(addr string, cfg transport.Config) (transport.Listener, error) {
	if err := p.Available(); err != nil {
		return nil, err
	}
	fam, ip, port, err := sockaddr(addr)
	if err != nil {
		return nil, err
	}
	ec, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	l := &listener{p: p, ec: ec, cfg: cfg.WithDefaults(), reqs: make(chan *C.struct_rdma_cm_id, 64), closed: make(chan struct{})}
	if r := C.lwv_create_id(ec.ch, &l.id); r < 0 {
		ec.stop(false)
		ec.destroy()
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", syscall.Errno(-r))
	}
	fail := func(what string, r C.int) (transport.Listener, error) {
		C.lwv_destroy_id(l.id)
		ec.stop(false)
		ec.destroy()
		return nil, fmt.Errorf("verbs: listen %s: %s: %w", addr, what, syscall.Errno(-r))
	}
	if r := C.lwv_bind(l.id, fam, (*C.uint8_t)(unsafe.Pointer(&ip[0])), C.uint16_t(port)); r < 0 {
		return fail("rdma_bind_addr", r)
	}
	if r := C.lwv_listen(l.id, 64); r < 0 {
		return fail("rdma_listen", r)
	}
	l.addr = idAddr(l.id, 0)
	go ec.run(l.event)
	p.log.WithField("addr", l.addr).Debug("listening")
	return l, nil
}

type listener struct {
	p    *Provider
	ec   *eventChannel
	id   *C.struct_rdma_cm_id
	addr string
	cfg  transport.Config

	reqs      chan *C.struct_rdma_cm_id
	closed    chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex // guards sending on reqs against Close
	shut      bool
}

// event runs on the listener's event goroutine.
func (l *listener) event(ev cmEvent) {
	if ev.kind != C.RDMA_CM_EVENT_CONNECT_REQUEST {
		l.p.log.WithField("event", ev.String()).Debug("listener event ignored")
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.shut {
		select {
		case l.reqs <- ev.id:
			return
		default:
		}
	}
	C.lwv_reject(ev.id)
	C.lwv_destroy_id(ev.id)
}

func (l *listener) Addr() string { return l.addr }

// Accept completes the next incoming connection request. Requests whose
// set-up fails are refused and logged; Accept goes on to the next.
func (l *listener) Accept(ctx context.Context) (transport.Conn, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closed:
			return nil, transport.ErrClosed
		case id := <-l.reqs:
			c, err := l.p.accept(ctx, id, l.cfg)
			if err == nil {
				return c, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			l.p.log.WithError(err).Warn("incoming connection failed")
		}
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.ec.stop(true)
		l.mu.Lock()
		l.shut = true
		l.mu.Unlock()
		for {
			select {
			case id := <-l.reqs:
				C.lwv_reject(id)
				C.lwv_destroy_id(id)
				continue
			default:
			}
			break
		}
		C.lwv_destroy_id(l.id)
		l.ec.destroy()
	})
	return nil
}

// Dial resolves addr to an RDMA device and route, builds a queue pair on
// that device and connects.
func (p *Provider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	if err := p.Available(); err != nil {
		return nil, err
	}
	fam, ip, port, err := sockaddr(addr)
	if err != nil {
		return nil, err
	}
	c, err := newConn(p, cfg.WithDefaults())
	if err != nil {
		return nil, err
	}
	if r := C.lwv_create_id(c.ec.ch, &c.id); r < 0 {
		c.destroy()
		return nil, fmt.Errorf("verbs: rdma_create_id: %w", syscall.Errno(-r))
	}
	c.start()
	fail := func(err error) (transport.Conn, error) {
		c.destroy()
		return nil, fmt.Errorf("verbs: dial %s: %w", addr, err)
	}
	ms := C.int(p.opts.ConnectTimeout / time.Millisecond)
	if r := C.lwv_resolve_addr(c.id, fam, (*C.uint8_t)(unsafe.Pointer(&ip[0])), C.uint16_t(port), ms); r < 0 {
		return fail(fmt.Errorf("rdma_resolve_addr: %w", syscall.Errno(-r)))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return fail(err)
	}
	if r := C.lwv_resolve_route(c.id, ms); r < 0 {
		return fail(fmt.Errorf("rdma_resolve_route: %w", syscall.Errno(-r)))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return fail(err)
	}
	if err := c.setupQP(); err != nil {
		return fail(err)
	}
	if r := C.lwv_connect(c.id, C.uint8_t(p.opts.Retry), C.uint8_t(p.opts.RNRRetry)); r < 0 {
		return fail(fmt.Errorf("rdma_connect: %w", syscall.Errno(-r)))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		return fail(err)
	}
	c.established()
	return c, nil
}

// accept builds a queue pair for a connection request and accepts it.
func (p *Provider) accept(ctx context.Context, id *C.struct_rdma_cm_id, cfg transport.Config) (*conn, error) {
	c, err := newConn(p, cfg)
	if err != nil {
		C.lwv_reject(id)
		C.lwv_destroy_id(id)
		return nil, err
	}
	if r := C.lwv_migrate_id(id, c.ec.ch); r < 0 {
		C.lwv_reject(id)
		C.lwv_destroy_id(id)
		c.destroy()
		return nil, fmt.Errorf("verbs: rdma_migrate_id: %w", syscall.Errno(-r))
	}
	c.id = id
	c.start()
	if err := c.setupQP(); err != nil {
		C.lwv_reject(id)
		c.destroy()
		return nil, err
	}
	if r := C.lwv_accept(id, C.uint8_t(p.opts.RNRRetry)); r < 0 {
		c.destroy()
		return nil, fmt.Errorf("verbs: rdma_accept: %w", syscall.Errno(-r))
	}
	if err := c.await(ctx, C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		c.destroy()
		return nil, fmt.Errorf("verbs: accept from %s: %w", idAddr(id, 1), err)
	}
	c.established()
	return c, nil
}
