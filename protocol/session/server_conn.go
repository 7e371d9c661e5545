package session

import (
	"bufio"
	clist "container/list"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/enum"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

// maxLogonFailures is how many failed AUTHENTICATEs one connection may
// send before it is dropped.
const maxLogonFailures = 3

// connState is where a connection is in session setup (MS-SMB2 3.3.5.5,
// reduced to NTLM). Only the connection's reader goroutine changes it, in
// setState.
type connState uint8

const (
	// stateNegotiate: waiting for SESSION_SETUP with an NTLM NEGOTIATE.
	stateNegotiate connState = iota
	// stateAuthenticate: a CHALLENGE went out; the next SESSION_SETUP
	// carries the AUTHENTICATE that answers it, once.
	stateAuthenticate
	// stateEstablished: the session exists; every frame is signed.
	stateEstablished
	// stateClosed: LOGOFF was answered, or setup failed too often; the
	// reader stops.
	stateClosed
)

var connStateNames = [...]string{"NEGOTIATE", "AUTHENTICATE", "ESTABLISHED", "CLOSED"}

func (s connState) String() string { return enum.Name(connStateNames[:], s, "connState") }

// serverConn is one client connection. Its reader goroutine decodes
// frames, enforces the message-id window and signatures in arrival order,
// runs session setup itself, and hands every other request to a goroutine
// of its own (bounded by MaxInFlight).
type serverConn struct {
	s   *Server
	nc  net.Conn
	log logrus.FieldLogger

	writeMu sync.Mutex

	// Owned by the reader goroutine.
	state     connState
	lastID    uint64
	haveID    bool
	challenge *smbauth.ServerState // in stateAuthenticate: the one CHALLENGE out
	failures  int

	sealedIn bool // a sealed frame was read: every later one must be

	sess     atomic.Pointer[serverSession]
	inflight sync.WaitGroup
	sem      chan struct{}
	stopping atomic.Bool

	// LEASE_BREAKs waiting to be written (lease.go).
	breakMu   sync.Mutex
	breakQ    []queuedBreak
	breakRun  bool
	breakStop bool
	breakSeq  uint64 // owned by the writing goroutine

	// addr is the peer's address without the port: the key of the
	// pending-connection and logon-throttling counts.
	addr       string
	notPending atomic.Bool    // out of the pending count (logged on, closed or evicted)
	pendingAt  *clist.Element // in pendingConns.order; guarded by its mutex
	idle       idleWatch
}

func (s *Server) newConn(nc net.Conn) *serverConn {
	id := s.nextConn.Add(1)
	return &serverConn{
		s:    s,
		nc:   nc,
		log:  s.log.WithFields(logrus.Fields{"conn": id, "remote": nc.RemoteAddr().String()}),
		sem:  make(chan struct{}, s.cfg.MaxInFlight),
		addr: hostOf(nc.RemoteAddr()),
		idle: idleWatch{timeout: s.cfg.IdleTimeout},
	}
}

// loggedOn takes the connection out of the pending count, once: it
// logged on, or it is closing.
func (c *serverConn) loggedOn() {
	if !c.notPending.Swap(true) {
		c.s.pending.done(c)
	}
}

// stopReading makes the reader stop at the next frame boundary (Close's
// graceful path): requests already read finish and are answered.
func (c *serverConn) stopReading() {
	c.stopping.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

func (c *serverConn) serve() {
	defer c.s.connWG.Done()
	c.log.Debug("connection open")
	err := c.readLoop()
	c.loggedOn()
	c.idle.stop()
	c.inflight.Wait()
	c.stopBreaks()
	c.nc.Close()
	if ss := c.sess.Load(); ss != nil {
		c.s.endSession(ss)
	}
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	switch {
	case err == nil, errors.Is(err, io.EOF), c.stopping.Load():
		c.log.Debug("connection closed")
	default:
		c.log.WithError(err).Warn("dropping connection")
	}
}

// readBufferSize is the read buffer of a connection: a frame's length and
// the rest of it (and often the frames after it) come in one read(2).
const readBufferSize = 64 << 10

func (c *serverConn) readLoop() error {
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.SetupTimeout))
	if c.stopping.Load() {
		// Close stopped this reader before it started: the deadline
		// just set would hold the shutdown for the setup timeout.
		return nil
	}
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	for {
		limit := uint32(MaxFrameSize)
		if c.sess.Load() == nil {
			limit = maxSetupFrameSize
		}
		f, raw, err := readFrame(br, limit)
		if err != nil {
			return err
		}
		if f.Flags&FlagResponse != 0 {
			return errors.New("session: client sent a response frame")
		}
		c.idle.touch()
		if c.haveID && f.MessageID <= c.lastID {
			c.log.WithFields(logrus.Fields{"msgid": f.MessageID, "last": c.lastID}).Warn("replayed message id")
			return ErrReplay
		}
		c.haveID, c.lastID = true, f.MessageID
		ss := c.sess.Load()
		if ss != nil {
			if err := c.checkIn(ss, &f, raw); err != nil {
				return err
			}
			if f.SessionID != ss.id {
				return errors.New("session: frame names another session")
			}
		} else if f.Flags&FlagSealed != 0 {
			return fmt.Errorf("%w: sealed frame before session setup", ErrBadSeal)
		}
		if f.Command == CmdSessionSetup {
			if err := c.sessionSetup(f); err != nil {
				return err
			}
			continue
		}
		if ss == nil {
			// Nothing but session setup before a session exists.
			c.respond(f.Header, protocol.StatusAccessDenied, nil)
			continue
		}
		if f.Command == CmdLogoff {
			ss.loggedOff.Store(true)
			c.respond(f.Header, protocol.StatusSuccess, nil)
			c.setState(stateClosed)
			return nil
		}
		if f.Command == CmdLeaseAck || len(c.sem) == 0 && inlineCommand(f.Command) && br.Buffered() == 0 && !ss.othersHoldLeases() {
			// Nothing else in flight and nothing more read: a quick
			// namespace operation runs on the reader itself, saving a
			// goroutine hand-off (and the wake-up of an idle thread
			// that comes with it) on every round trip at queue depth 1.
			// A request that comes meanwhile waits for it, as it
			// would for a free thread.
			c.idle.busy.Add(1)
			err := c.handle(ss, f)
			c.idle.busy.Add(-1)
			if err != nil {
				c.log.WithError(err).WithField("cmd", f.Command).Warn("dropping connection: malformed request")
				return err
			}
			continue
		}
		c.sem <- struct{}{}
		c.inflight.Add(1)
		c.idle.busy.Add(1)
		go func() {
			defer func() { <-c.sem; c.idle.busy.Add(-1); c.inflight.Done() }()
			if err := c.handle(ss, f); err != nil {
				// A malformed body: the peer is broken or hostile.
				c.log.WithError(err).WithField("cmd", f.Command).Warn("dropping connection: malformed request")
				c.nc.Close()
			}
		}()
	}
}

// inlineCommand reports whether a request is quick enough to run on the
// connection's reader when it is alone: single-inode namespace operations
// on the local disk, LEASE, and BATCH (what a client held back of one
// small file). Data (READ, WRITE), FSYNC, READDIR (a whole directory),
// COPY_RANGE and FALLOCATE (which may move or allocate hundreds of
// megabytes) and the pipe go to their own goroutine.
func inlineCommand(cmd Command) bool {
	switch cmd {
	case CmdGetAttr, CmdSetAttr, CmdMkdir, CmdRmdir, CmdOpen, CmdClose, CmdUnlink, CmdRename,
		CmdSymlink, CmdReadlink, CmdLink, CmdGetXattr, CmdSetXattr, CmdListXattr, CmdRemoveXattr,
		CmdIoctl, CmdEcho, CmdTreeConnect, CmdTreeDisconnect, CmdStatFS, CmdSeek, CmdTmpfile, CmdLinkHandle,
		CmdLease, CmdBatch, CmdLock, CmdUnlock, CmdGetLk, CmdCancel, CmdReopen:
		return true
	}
	return false
}

// sessionSetup runs one round of the NTLM exchange (MS-SMB2 3.3.5.5):
// NEGOTIATE → MORE_PROCESSING_REQUIRED with the CHALLENGE, then
// AUTHENTICATE → SUCCESS (signed with the new key) or LOGON_FAILURE.
func (c *serverConn) sessionSetup(f Frame) error {
	if c.state == stateEstablished {
		c.respond(f.Header, protocol.StatusRequestNotAccepted, nil)
		return nil
	}
	var tok setupReq
	if err := unmarshal(f.Body, &tok); err != nil {
		return err
	}
	if c.state == stateNegotiate {
		chal, st, err := c.s.auth.Challenge(tok.Token)
		if err != nil {
			c.log.WithError(err).Warn("bad NTLM NEGOTIATE")
			c.respond(f.Header, protocol.StatusInvalidParameter, nil)
			return nil
		}
		c.challenge = st
		c.setState(stateAuthenticate)
		c.respond(f.Header, protocol.StatusMoreProcessingReq, &tokenMsg{Token: chal})
		return nil
	}
	st := c.challenge
	c.challenge = nil
	c.setState(stateNegotiate) // a challenge is answered once, right or wrong
	// Who claims to log on, for the throttle; a message that does not
	// parse fails below as a logon failure of user "".
	var user, domain string
	if am, err := smbauth.ParseAuthenticate(tok.Token); err == nil {
		user, domain = am.UserName, am.DomainName
	}
	if wait := c.s.throttle.admit(user, c.addr); wait > 0 {
		c.s.logonsThrottled.Add(1)
		c.s.throttleWait.Add(int64(wait))
		if !c.s.sleep(wait) {
			c.s.throttle.abandoned(user, c.addr)
			return ErrServerClosed
		}
	}
	res, err := st.Authenticate(tok.Token)
	if err != nil {
		c.failures++
		c.s.logonFailures.Add(1)
		uf, af := c.s.throttle.failed(user, c.addr)
		// One fixed line per failure, for fail2ban and the like
		// (docs/security.md): addr is the first field after msg in the
		// text format and the first key in JSON.
		c.log.WithError(err).WithFields(logrus.Fields{"addr": c.addr, "user": user, "domain": domain,
			"failures": uf, "addr_failures": af}).Warn("logon failure")
		c.respond(f.Header, protocol.StatusLogonFailure, nil)
		if c.failures >= maxLogonFailures {
			c.setState(stateClosed)
			return errors.New("session: too many logon failures")
		}
		return nil
	}
	c.s.throttle.succeeded(res.User, c.addr)
	ident, guest, err := c.s.accounts.Identity(res.User)
	if err != nil {
		// The password was right: not a logon failure, and not
		// throttled as one. The user needs an account on this host.
		c.log.WithFields(logrus.Fields{"user": res.User, "domain": res.Domain}).WithError(err).
			Warn("logon refused: the user has no Unix account on this server and no guest_account is configured")
		c.respond(f.Header, StatusNoSuchUser, nil)
		c.setState(stateClosed)
		return fmt.Errorf("session: %w", err)
	}
	cipher, always, refuse := c.s.sealPolicy(tok.Offer, res.Flags&smbauth.FlagSeal != 0)
	if refuse != "" {
		c.log.WithFields(logrus.Fields{"user": res.User, "encrypt": c.s.cfg.Encrypt, "offer": tok.Offer.Ciphers}).
			Warn("session refused: " + refuse)
		c.respond(f.Header, StatusSealRequired, nil)
		c.setState(stateClosed)
		return fmt.Errorf("%w: %s", ErrSealRequired, refuse)
	}
	ss := &serverSession{
		id:      c.s.nextSession.Add(1),
		key:     res.SessionKey,
		macs:    newMACs(res.SessionKey),
		user:    strings.ToLower(res.User),
		ident:   ident,
		conn:    c,
		trees:   map[uint32]*share.Tree{},
		handles: map[Handle]*openFile{},
		locks:   share.NewLockSpace(c.s.lockTab),
		waits:   map[uint64]*share.Waiter{},
	}
	ss.sendBreak = c.sendBreak
	done := &sessionSetupDone{ServerName: c.s.cfg.ServerName, Seal: sealAnswer{Cipher: cipher, Echo: tok.Offer}}
	if cipher != smbauth.CipherNone {
		if ss.seal, err = newSessionSeal(res.SessionKey, ss.id, cipher, always, true); err != nil {
			return err
		}
		if always {
			done.Seal.Flags |= sealAnswerSealed
		}
	}
	c.s.registerSession(ss)
	c.log = c.log.WithFields(logrus.Fields{"session": ss.id, "user": res.User})
	c.log.WithFields(logrus.Fields{"domain": res.Domain, "workstation": res.Workstation, "cipher": cipher, "sealed": always,
		"account": ident.Account.Name, "uid": ident.Account.Uid, "guest": guest}).Info("session established")
	c.nc.SetReadDeadline(time.Time{})
	c.loggedOn()
	if c.idle.timeout > 0 {
		c.idle.start(func(idle time.Duration) {
			c.log.WithField("idle", idle.Round(time.Second).String()).Info("closing a session idle for longer than idle_timeout")
			c.stopReading()
		})
	}
	h := f.Header
	h.SessionID = ss.id
	// The final response is the first signed frame; the session key is in
	// force for every frame after it, both ways.
	c.respondSigned(h, ss.macs, protocol.StatusSuccess, done)
	c.sess.Store(ss)
	c.setState(stateEstablished)
	if c.stopping.Load() {
		c.nc.SetReadDeadline(time.Now())
	}
	return nil
}

// setState is the one place the connection changes state.
func (c *serverConn) setState(to connState) {
	c.log.WithFields(logrus.Fields{"from": c.state, "to": to}).Trace("connection state")
	c.state = to
}

// respond writes a response to req, signed when a session is established.
func (c *serverConn) respond(req Header, st protocol.Status, body message) {
	var m *macs
	if ss := c.sess.Load(); ss != nil {
		m = ss.macs
		req.SessionID = ss.id
	}
	c.respondSigned(req, m, st, body)
}

func (c *serverConn) respondSigned(req Header, m *macs, st protocol.Status, body message) {
	h := Header{
		MessageID: req.MessageID,
		Command:   req.Command,
		Flags:     FlagResponse,
		Status:    st,
		SessionID: req.SessionID,
		TreeID:    req.TreeID,
	}
	// A response is sealed exactly when its request was.
	var sl *sealer
	if req.Flags&FlagSealed != 0 {
		sl = c.sess.Load().seal.out
	}
	var e encoder
	e.b = frameBuf(frameCap(body))
	e.b = appendHeader(e.b, h, sl != nil)
	if body != nil && (st == protocol.StatusSuccess || st == protocol.StatusMoreProcessingReq) {
		body.code(&e)
	}
	raw := e.b
	if len(raw) > MaxFrameSize {
		raw = appendHeader(raw[:0], Header{MessageID: h.MessageID, Command: h.Command, Flags: FlagResponse,
			Status: protocol.StatusBufferOverflow, SessionID: h.SessionID, TreeID: h.TreeID}, sl != nil)
	}
	putLength(raw)
	if m != nil && sl == nil {
		m.signFrame(raw)
	}
	c.writeMu.Lock()
	defer func() {
		c.writeMu.Unlock()
		freeFrame(raw)
	}()
	if sl != nil {
		if err := sl.seal(raw); err != nil {
			c.log.WithError(err).Warn("dropping connection")
			c.nc.Close()
			return
		}
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
	if _, err := c.nc.Write(raw); err != nil {
		c.log.WithError(err).Debug("response write failed")
		c.nc.Close()
	}
}
