package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/defaults"
	"github.com/lwiofs/lwiofs/internal/quietlog"
	"github.com/lwiofs/lwiofs/internal/readturn"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/smbauth"
)

// ErrClosed is why every call fails on a client whose connection is
// closed or broken: they return a *protocol.ConnectionError wrapping it
// (and the cause, when the connection broke), which ToErrno maps to
// ENOTCONN.
var ErrClosed = errors.New("session: connection closed")

// ToErrno is ntstatus.ToErrno, the one status → errno mapping.
var ToErrno = ntstatus.ToErrno

// ErrLogonFailure is returned by Dial when the server refuses the
// credentials; it wraps protocol.StatusLogonFailure.
var ErrLogonFailure = fmt.Errorf("logon failure: wrong user name or password (%w)", protocol.StatusLogonFailure)

// ErrNoAccount is returned by Dial when the credentials were right but the
// server has no Unix account for the user (and no guest account) for its
// disk operations to run as; it wraps StatusNoSuchUser.
var ErrNoAccount = fmt.Errorf("logon refused: the server has no Unix account for this user (%w)", StatusNoSuchUser)

// ClientConfig configures Dial.
type ClientConfig struct {
	// User and Domain name the account; Domain may be empty.
	User, Domain string
	// Password is the plaintext password; when empty NTHash is used.
	Password string
	// NTHash is the password's NT hash (smbauth.NTHash), used when
	// Password is empty.
	NTHash *[16]byte
	// Workstation is the NTLM workstation name; empty means os.Hostname().
	Workstation string
	// Logger receives connection events; nil means quiet.
	Logger logrus.FieldLogger
	// WriteTimeout bounds one request write; a server that does not read
	// for that long breaks the connection. Zero means 30 seconds.
	WriteTimeout time.Duration
	// KeepAlive is how often an idle session sends ECHO, and how long the
	// answer may take before the connection is declared dead (so that a
	// vanished server fails calls instead of hanging them). Zero means
	// 15 seconds; negative disables it.
	KeepAlive time.Duration
	// Seal is what the client does about sealing (seal.go); the zero value
	// SealAuto seals when the server or share asks.
	Seal SealMode
	// Ciphers are the ciphers offered, in order of preference; nil means
	// smbauth.DefaultCiphers.
	Ciphers []smbauth.Cipher
}

// Client is an authenticated session over one TCP connection. All methods
// are safe for concurrent use; requests are multiplexed by message id.
type Client struct {
	nc  net.Conn
	log logrus.FieldLogger
	cfg ClientConfig

	writeMu sync.Mutex
	nextID  uint64 // guarded by writeMu: ids go out in increasing order

	mu      sync.Mutex
	pending map[uint64]chan Frame // nil channel: the caller gave up
	err     error                 // why the connection died
	// openBatches: the abandoned BATCHes (pending nil) whose last
	// request is an OPEN, by id: how many requests each has.
	openBatches map[uint64]int
	// breakTo handles each tree's LEASE_BREAKs; lastBreak is the last
	// break's sequence number (lease.go).
	breakTo   map[uint32]func(LeaseBreak) LeaseState
	lastBreak uint64

	key        atomic.Pointer[[]byte] // session key, set during setup
	macs       atomic.Pointer[macs]   // signs and verifies with key
	signing    atomic.Bool            // every frame signed both ways
	sessionID  uint64
	serverName string

	seal        atomic.Pointer[sessionSeal] // the sealing keys; nil: cannot seal
	sealing     atomic.Bool                 // requests are sealed from now on
	firstSealed atomic.Uint64               // id of the first sealed request; 0: none yet

	// The read side (clientread.go): whoever holds rdMu reads rd.
	rdMu     sync.Mutex
	rd       *frameReader
	intr     *readturn.Intr
	kick     chan struct{} // the token is free and callers wait
	waiting  atomic.Int32  // callers waiting for an answer without reading
	lastTurn atomic.Int64  // when the last turn ended (UnixNano)
	yield    atomic.Int64  // readYield (ns)
	ownReads atomic.Uint64 // answers read by their own caller

	done      chan struct{}
	closeOnce sync.Once
}

// Dial connects to a session server at addr and runs session setup (the
// NTLMv2 exchange). Wrong credentials give an error wrapping
// ErrLogonFailure ("logon failure: wrong user name or password").
func Dial(ctx context.Context, addr string, cfg ClientConfig) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := newClient(nc, cfg)
	if err := c.setup(ctx); err != nil {
		c.Close()
		return nil, err
	}
	if cfg.KeepAlive >= 0 {
		go c.keepAlive(cmp.Or(cfg.KeepAlive, 15*time.Second))
	}
	return c, nil
}

// keepAlive sends ECHO every interval while the connection is up and fails
// it when an ECHO goes unanswered for an interval.
func (c *Client) keepAlive(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		err := c.call(ctx, CmdEcho, 0, &empty{}, &empty{})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			c.log.WithField("timeout", interval).Warn("server does not answer ECHO: dropping connection")
			c.fail(errors.New("session: keepalive timed out"))
			return
		}
	}
}

func newClient(nc net.Conn, cfg ClientConfig) *Client {
	defaults.Set(&cfg.WriteTimeout, 30*time.Second)
	if cfg.Workstation == "" {
		cfg.Workstation, _ = os.Hostname()
	}
	c := &Client{
		nc:      nc,
		cfg:     cfg,
		log:     quietlog.Or(cfg.Logger).WithField("server", nc.RemoteAddr().String()),
		pending: map[uint64]chan Frame{},
		rd:      newFrameReader(nc),
		intr:    readturn.New(nc),
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	c.yield.Store(int64(readYield))
	go c.readLoop()
	return c
}

// setup runs SESSION_SETUP twice: NEGOTIATE → CHALLENGE, AUTHENTICATE →
// success, whose response is the first signed frame.
func (c *Client) setup(ctx context.Context) error {
	// The exchange is bounded by ctx: a dead or silent server must not
	// hang Dial.
	stop := context.AfterFunc(ctx, func() { c.fail(ctx.Err()) })
	defer stop()
	nc := smbauth.NewClient(smbauth.ClientConfig{
		User: c.cfg.User, Domain: c.cfg.Domain, Workstation: c.cfg.Workstation,
		Password: c.cfg.Password, NTHash: c.cfg.NTHash, RequestSeal: c.cfg.Seal != SealNever,
	})
	neg, err := nc.Negotiate()
	if err != nil {
		return err
	}
	offer := c.offer()
	var chal tokenMsg
	h, err := c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: neg, Offer: offer}, &chal)
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	if h.Status != protocol.StatusMoreProcessingReq {
		return fmt.Errorf("session setup: server answered NEGOTIATE with %v", h.Status)
	}
	auth, key, err := nc.Authenticate(chal.Token)
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	c.key.Store(&key)
	c.macs.Store(newMACs(key))
	var done sessionSetupDone
	h, err = c.roundTrip(ctx, CmdSessionSetup, 0, &setupReq{Token: auth, Offer: offer}, &done)
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	switch h.Status {
	case protocol.StatusSuccess:
	case protocol.StatusLogonFailure, protocol.StatusAccessDenied:
		return ErrLogonFailure
	case StatusNoSuchUser:
		return ErrNoAccount
	case StatusSealRequired:
		return c.setupSealError()
	default:
		return fmt.Errorf("session setup: %w", h.Status)
	}
	if h.Flags&FlagSigned == 0 {
		return errors.New("session setup: final response not signed")
	}
	if err := c.acceptSeal(done.Seal, offer, nc.Negotiated()&smbauth.FlagSeal != 0, key, h.SessionID); err != nil {
		return err
	}
	c.sessionID = h.SessionID
	c.serverName = done.ServerName
	c.signing.Store(true)
	c.log.WithFields(logrus.Fields{"session": c.sessionID, "sealed": c.Sealed(), "cipher": c.Cipher()}).Debug("session established")
	return nil
}

// SessionID is the server's id for this session (LWIO AUTH and REGISTER
// carry it).
func (c *Client) SessionID() uint64 { return c.sessionID }

// SessionKey is the NTLM exported session key, which signs this channel
// and the LWIO AUTH exchange.
func (c *Client) SessionKey() []byte {
	if k := c.key.Load(); k != nil {
		return append([]byte(nil), (*k)...)
	}
	return nil
}

// ServerName is the name the server gave at session setup.
func (c *Client) ServerName() string { return c.serverName }

// Done is closed when the connection is gone; every call then fails with a
// *protocol.ConnectionError wrapping ErrClosed (and what broke it).
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended (a *protocol.ConnectionError), or
// nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; the server ends the session with it, and
// with the session every open handle, resume key and LWIO key.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// fail breaks the connection once, failing every pending call.
func (c *Client) fail(err error) {
	c.closeOnce.Do(func() {
		if !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		c.mu.Lock()
		c.err = &protocol.ConnectionError{Conn: "session " + c.nc.RemoteAddr().String(), Err: err}
		c.mu.Unlock()
		c.nc.Close()
		close(c.done)
	})
}

// accept checks a response's signature and message id and delivers it;
// woke reports whether a waiting caller got it.
func (c *Client) accept(f Frame, raw []byte) (woke bool, err error) {
	if f.Flags&FlagResponse == 0 {
		return false, errors.New("session: server sent a request frame")
	}
	sealed := f.Flags&FlagSealed != 0
	switch {
	case sealed:
		sl := c.seal.Load()
		if sl == nil {
			return false, fmt.Errorf("%w: sealed frame on a session without sealing keys", ErrBadSeal)
		}
		body, err := sl.in.open(raw)
		if err != nil {
			return false, err
		}
		f.Body = body
	case f.Flags&FlagSigned != 0:
		m := c.macs.Load()
		if m == nil || !m.verifyFrame(raw) {
			return false, ErrBadSignature
		}
	case c.signing.Load():
		return false, ErrUnsigned
	}
	if f.Command == CmdLeaseBreak && c.signing.Load() {
		return false, c.onBreak(f)
	}
	c.mu.Lock()
	ch, ok := c.pending[f.MessageID]
	delete(c.pending, f.MessageID)
	ops := c.openBatches[f.MessageID]
	delete(c.openBatches, f.MessageID)
	c.mu.Unlock()
	if !ok {
		// Not a request in flight: a replay or a forgery.
		return false, ErrReplay
	}
	// The server seals exactly the responses to sealed requests.
	if first := c.firstSealed.Load(); sealed != (first != 0 && f.MessageID >= first) {
		if sealed {
			return false, fmt.Errorf("%w: sealed response to an unsealed request", ErrBadSeal)
		}
		return false, ErrUnsealed
	}
	if ch != nil {
		ch <- f
		return true, nil
	}
	c.abandoned(f, ops)
	return false, nil
}

// abandoned takes an answer whose caller gave up (an interrupted FUSE
// request): when the server opened something, it is closed rather than
// left open for the session's life — also by the OPEN that ends a BATCH
// of ops requests (openOps; 0: none ends with one).
func (c *Client) abandoned(f Frame, ops int) {
	if f.Status != protocol.StatusSuccess {
		return
	}
	switch {
	case f.Command == CmdOpen || f.Command == CmdPipeOpen:
		go c.closeAbandoned(f)
	case f.Command == CmdBatch && ops > 0:
		var r batchResp
		if unmarshal(f.Body, &r) != nil || len(r.Results) != ops || r.Results[ops-1].Status != uint32(protocol.StatusSuccess) {
			return // the OPEN did not run, or failed
		}
		f.Command, f.Body = CmdOpen, r.Results[ops-1].Body
		go c.closeAbandoned(f)
	}
}

// openOps is how many requests req has when it is a BATCH ending with an
// OPEN, else 0.
func openOps(req message) int {
	if b, ok := req.(*batchReq); ok && len(b.Ops) > 0 && Command(b.Ops[len(b.Ops)-1].Command) == CmdOpen {
		return len(b.Ops)
	}
	return 0
}

// abandonDelivered: the caller gave up after accept took its answer off
// pending, so the answer is in ch or about to be (accept sends right
// after), unless the connection failed in between. It is an abandoned
// answer all the same.
func (c *Client) abandonDelivered(ch chan Frame, ops int) {
	select {
	case f := <-ch:
		answerPool.Put(ch)
		c.abandoned(f, ops)
	case <-c.done:
		// Nothing can be closed any more; ch may still be sent to, so it
		// does not go back to the pool.
	}
}

func (c *Client) closeAbandoned(f Frame) {
	var h Handle
	if f.Command == CmdOpen {
		var r openResp
		if unmarshal(f.Body, &r) != nil {
			return
		}
		h = r.Handle
	} else {
		var r handleMsg
		if unmarshal(f.Body, &r) != nil {
			return
		}
		h = r.Handle
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.call(ctx, CmdClose, f.TreeID, &handleMsg{Handle: h}, &empty{}); err != nil {
		c.log.WithError(err).WithField("handle", h).Debug("closing an abandoned handle failed")
	}
}

// answerPool keeps the channels a call's answer comes on (one buffered
// Frame each).
var answerPool = sync.Pool{New: func() any { return make(chan Frame, 1) }}

// roundTrip sends one request and waits for its response, decoding the body
// into resp when the status is success (or MORE_PROCESSING_REQUIRED). The
// status is in the returned header, not the error.
func (c *Client) roundTrip(ctx context.Context, cmd Command, tree uint32, req, resp message) (Header, error) {
	return c.exchange(ctx, cmd, tree, req, resp, nil)
}

// exchange is roundTrip with a way out for a caller that gives up: when ctx
// ends first, giveUp (if not nil) may still produce the request's answer
// (a CANCEL's outcome, lock.go); otherwise the answer, whether it comes
// later or came just as the caller gave up, is abandoned (accept).
func (c *Client) exchange(ctx context.Context, cmd Command, tree uint32, req, resp message,
	giveUp func(id uint64, ch chan Frame) (Frame, bool)) (Header, error) {
	if err := ctx.Err(); err != nil {
		return Header{}, err
	}
	var e encoder
	e.b = frameBuf(frameCap(req))
	sealed := c.sealing.Load()
	e.b = appendHeader(e.b, Header{Command: cmd, SessionID: c.sessionID, TreeID: tree}, sealed)
	if req != nil {
		req.code(&e)
	}
	raw := e.b
	if len(raw) > MaxFrameSize {
		return Header{}, protocol.StatusInvalidParameter
	}
	putLength(raw)
	ch := answerPool.Get().(chan Frame)

	c.writeMu.Lock()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.writeMu.Unlock()
		return Header{}, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	var werr error
	if !sealed && c.sealing.Load() {
		// Sealing started (a tree connect's answer) since raw was encoded.
		raw, sealed = withSeqRoom(raw), true
	}
	putMessageID(raw, id)
	switch {
	case sealed:
		if c.firstSealed.Load() == 0 {
			c.firstSealed.Store(id)
		}
		werr = c.seal.Load().out.seal(raw)
	case c.signing.Load():
		c.macs.Load().signFrame(raw)
	}
	if werr == nil {
		c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
		_, werr = c.nc.Write(raw)
	}
	c.writeMu.Unlock()
	freeFrame(raw)
	if werr != nil {
		c.fail(werr)
		return Header{}, c.Err()
	}

	f, err := c.await(ctx, ch)
	if err != nil {
		if ctx.Err() == nil {
			return Header{}, err // the connection failed
		}
		var ok bool
		if giveUp != nil {
			f, ok = giveUp(id, ch)
		}
		if !ok {
			c.mu.Lock()
			_, still := c.pending[id]
			ops := openOps(req)
			if still {
				c.pending[id] = nil // the response, when it comes, is abandoned
				if ops > 0 {
					if c.openBatches == nil {
						c.openBatches = map[uint64]int{}
					}
					c.openBatches[id] = ops
				}
			}
			c.mu.Unlock()
			if !still {
				// Too late: the answer came meanwhile (or is coming).
				c.abandonDelivered(ch, ops)
			}
			return Header{}, ctx.Err()
		}
	}
	// The answer came out of ch: accept took ch out of pending before
	// sending, so nothing else will; it serves another call.
	answerPool.Put(ch)
	if resp != nil && (f.Status == protocol.StatusSuccess || f.Status == protocol.StatusMoreProcessingReq) {
		if err := unmarshal(f.Body, resp); err != nil {
			c.log.WithError(err).WithField("cmd", cmd).Warn("dropping connection: malformed response")
			c.fail(err)
			return f.Header, err
		}
	}
	return f.Header, nil
}

// call is roundTrip for an operation: a non-success status is the error.
func (c *Client) call(ctx context.Context, cmd Command, tree uint32, req, resp message) error {
	h, err := c.roundTrip(ctx, cmd, tree, req, resp)
	if err != nil {
		return err
	}
	return h.Status.Err()
}
