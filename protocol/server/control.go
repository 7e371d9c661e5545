package server

import (
	"fmt"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// authParamsOff is where a slot's registered area holds the server's
// LWIO_AUTH_PARAMS while they are RDMA-written (FIG. 6B).
const authParamsOff = 32

// auth handles the connection's first message, which must be AUTH (FIG.
// 5, 6A–C). It runs on the reaper: nothing else can be outstanding yet.
// derr is what DecodeRequest said of the n-byte message. Anything but AUTH ends
// the connection at once; an AUTH that is malformed or refused is answered
// with a failure status, after which the connection ends (complete).
func (c *conn) auth(req *protocol.Request, derr error, n int, rb *recvBuf) {
	c.endAuth()
	switch {
	case n < protocol.HeaderSize:
		c.giveBack(rb)
		c.fail(derr)
		return
	case req.Header.Opcode != protocol.OpAuth:
		c.giveBack(rb)
		c.fail(fmt.Errorf("protocol violation: %v before AUTH", req.Header.Opcode))
		return
	}
	sl, err := c.slots.get()
	if err != nil {
		c.giveBack(rb)
		c.fail(err)
		return
	}
	sl.req = *req
	sl.recv = rb
	sl.authn = true
	sl.start = time.Now() // for the latency count (stats.go)
	wrs, st, info, why := c.authenticate(sl, derr)
	if st != protocol.StatusSuccess {
		c.log.WithField("reason", why).Warn("lwio: authentication refused")
	}
	c.complete(sl, wrs, st, info)
	// The AUTH response is queued: a delta credit from the balancer may
	// follow it now, never overtake it.
	c.answered.Store(st == protocol.StatusSuccess)
}

// authenticate checks an AUTH (FIG. 6A) and, if it passes, sets the
// connection up: credits granted and their receives posted, the session
// attached, the server's parameters (FIG. 6B) built in the slot and the
// RDMA WRITE that delivers them returned for complete to post ahead of
// the STATUS_RESPONSE (FIG. 6C). A refusal returns its status and why.
func (c *conn) authenticate(sl *slot, derr error) ([]transport.SendWR, protocol.Status, uint32, string) {
	h, p := &sl.req.Header, &sl.req.Auth
	deny := protocol.StatusAccessDenied
	switch {
	case derr != nil:
		return nil, deny, 0, derr.Error()
	case p.HeaderSize != protocol.HeaderSize:
		return nil, deny, 0, fmt.Sprintf("HeaderSize %d, want %d", p.HeaderSize, protocol.HeaderSize)
	case !p.HasKey || !p.HasSignature:
		return nil, deny, 0, "Key or Signature option missing"
	}
	id, key, ok := c.s.cfg.Authority.SessionByKey(p.Key)
	switch {
	case !ok:
		return nil, deny, 0, "unknown Key"
	case !p.Verify(key):
		return nil, deny, 0, "bad Signature"
	case p.HasSessionID && p.SessionID != id:
		return nil, deny, 0, "SessionId of another session"
	case !c.s.claimKey(p.Key):
		return nil, deny, 0, "Key already authenticated a connection (replayed AUTH?)"
	}
	ds, why := c.sealDecision(id, p)
	if why != "" {
		return nil, deny, 0, why
	}
	if ds.cipher != smbauth.CipherNone {
		if err := c.startSeal(ds, key, p.Key, p.Nonce); err != nil {
			return nil, deny, 0, fmt.Sprintf("sealing: %v", err)
		}
	}
	want := int(p.Credits)
	if want <= 0 || want > c.s.cfg.Credits {
		want = c.s.cfg.Credits
	}
	granted := c.s.takeForAuth(want)
	if granted == 0 {
		return nil, protocol.StatusInsufficientResources, 0, "server buffer memory exhausted"
	}
	c.mu.Lock()
	c.budget = granted
	c.peerPage = int(p.PageSize)
	c.mu.Unlock()
	if err := c.pool.addCredits(granted); err != nil {
		return nil, protocol.StatusInsufficientResources, 0, fmt.Sprintf("posting receives: %v", err)
	}
	// The Key echoed is the one the client presented, which is the one
	// the server issued in the negotiate response (docs/wire.md, "AUTH
	// response").
	sp := protocol.AuthParams{
		RevID:             protocol.RevID,
		Endian:            protocol.AuthEndian,
		PageSize:          uint16(c.s.cfg.PageSize),
		BaseSequence:      p.BaseSequence + 1,
		MaxRdmaWindowSize: uint32(c.s.cfg.MaxRdmaWindowSize),
		MaxSendBufferSize: protocol.StatusResponseSize,
		MaxRecvBufferSize: uint32(c.s.cfg.MaxRecvBufferSize),
		HeaderSize:        protocol.HeaderSize,
		Credits:           uint16(granted),
		HasKey:            true,
		Key:               p.Key,
		HasSessionID:      true,
		SessionID:         id,
		HasNonce:          ds.cipher != smbauth.CipherNone,
		Nonce:             ds.nonce,
	}
	sp.Sign(key)
	enc := sp.Append(sl.resp.Bytes()[authParamsOff:authParamsOff])
	c.grant = protocol.NewCreditGrant(granted)
	c.s.authed.Add(1)
	sess := c.s.attach(id, key)
	c.mu.Lock()
	c.sess = sess
	c.state = stateOpen
	c.mu.Unlock()
	c.log.WithFields(map[string]any{"session": id, "credits": granted}).Info("lwio: connection authenticated")
	info := protocol.NewAuthResponse(h.Cookie(), &sp, protocol.StatusSuccess).Ios.Information
	wr := transport.SendWR{
		Op:         transport.OpWrite,
		SGL:        sl.sgl(0, transport.Segment{Region: sl.resp, Offset: authParamsOff, Length: len(enc)}),
		RemoteAddr: h.DataVa,
		RKey:       h.DataMh,
	}
	return append(sl.wrs[:0], wr), protocol.StatusSuccess, info, ""
}

// execControl runs REGISTER, CLOSE, CANCEL and a repeated AUTH, each
// completed with a STATUS_RESPONSE send.
func (c *conn) execControl(sl *slot) {
	defer c.reqs.Done()
	st, info := c.control(sl)
	c.complete(sl, nil, st, info)
}

// control is execControl's handler: the status and Information to answer.
func (c *conn) control(sl *slot) (protocol.Status, uint32) {
	h := &sl.req.Header
	switch h.Opcode {
	case protocol.OpRegister:
		return c.register(sl)
	case protocol.OpClose:
		// FIG. 12A/B: later requests on the Fid fail; queued ones are
		// cancelled, executing ones finish.
		return onFid(c.sess.unregister(h.Fid), (*fidEntry).close)
	case protocol.OpCancel:
		// FIG. 13A/B: queued requests complete with STATUS_CANCELLED.
		return onFid(c.sess.lookup(h.Fid), (*fidEntry).cancel)
	}
	return protocol.StatusAccessDenied, 0 // AUTH on an authenticated connection
}

// onFid runs CLOSE's or CANCEL's action on the Fid's entry: SUCCESS, or
// STATUS_INVALID_HANDLE when the Fid names no registered file.
func onFid(e *fidEntry, action func(*fidEntry)) (protocol.Status, uint32) {
	if e == nil {
		return protocol.StatusInvalidHandle, 0
	}
	action(e)
	return protocol.StatusSuccess, 0
}

// register handles REGISTER (FIG. 7A/B): the resume key must resolve on the
// connection's own session; the Fid returned is scoped to that session.
func (c *conn) register(sl *slot) (protocol.Status, uint32) {
	fp := &sl.req.Register
	if fp.SessionID != c.sess.id {
		return protocol.StatusAccessDenied, 0
	}
	f, err := c.s.cfg.Authority.OpenByResumeKey(c.sess.id, [24]byte(fp.ResumeKey))
	if err != nil {
		st := ntstatus.FromError(err)
		if st == protocol.StatusUnsuccessful {
			st = protocol.StatusInvalidHandle
		}
		return st, 0
	}
	fid, ok := c.sess.register(f, fp.FlagsAndAttributes)
	if !ok {
		return protocol.StatusInsufficientResources, 0
	}
	c.log.WithField("fid", fid).Debug("lwio: file registered")
	return protocol.StatusSuccess, uint32(fid)
}

// ordered decides CREDIT (FIG. 11B/C) and INTERRUPT (FIG. 9A/B) requests
// on the reaper, in arrival order, and answers them from a goroutine (or,
// for a held INTERRUPT, at the next I/O completion). c.reqs was added for sl.
func (c *conn) ordered(sl *slot) {
	answer := func(st protocol.Status) {
		go func() {
			defer c.reqs.Done()
			c.complete(sl, nil, st, 0)
		}()
	}
	if sl.req.Header.Opcode == protocol.OpInterrupt {
		// Held until the next I/O completion on the connection; answered
		// at once when no I/O is outstanding, so an I/O that completed
		// just before the INTERRUPT arrived cannot leave the client
		// asleep. Only one may be outstanding.
		c.mu.Lock()
		switch {
		case c.intr != nil:
			c.mu.Unlock()
			answer(protocol.StatusInvalidDeviceRequest)
		case c.ioInflight == 0:
			c.mu.Unlock()
			answer(protocol.StatusSuccess)
		default:
			c.intr = sl
			c.mu.Unlock()
			c.reqs.Done() // complete answers it with the next I/O
		}
		return
	}
	st, released, err := c.grant.CreditMessage(sl.req.Header.CreditCount())
	if err != nil {
		c.fail(err)
		c.releaseRecv(sl)
		c.grant.Complete()
		c.slots.put(sl.idx)
		c.reqs.Done()
		return
	}
	c.s.budget.Give(released)
	c.mu.Lock()
	c.budget -= released
	c.mu.Unlock()
	// The pool posts fewer receives from now on: this message's buffer,
	// and as many others as were given back, are not posted again.
	c.pool.addCredits(-released)
	answer(st) // NOTIFY_CREDIT retires the credit (complete)
}

// retireAfter is how many consecutive requests must show a Credits hint
// under a quarter of the grant before the server takes credits back.
const retireAfter = 1024

// policy runs on every request with its Credits hint (the client's pending
// requests): a client that uses every credit gets more, doubling up to
// MaxCredits as the server-wide budget allows; one that keeps using a small
// share gives the surplus back.
func (c *conn) policy(hint uint8) {
	g := c.grant.Granted()
	cfg := &c.s.cfg
	switch {
	case int(hint) >= g && g < cfg.MaxCredits:
		c.lowHints = 0
		// While the budget is contended, no one grows past a fair share.
		k := min(g, cfg.MaxCredits-g, c.s.growthCap()-g)
		if k > 0 && !c.grant.Open() && !c.startDelta(k) && c.s.budget.Free() <= 0 {
			c.s.short() // the balancer evens out the others
		}
	case g > cfg.Credits && int(hint)*4 < g:
		c.lowHints++
		if c.lowHints >= retireAfter && !c.grant.Open() {
			c.lowHints = 0
			c.startDelta(-(g - cfg.Credits))
		}
	default:
		c.lowHints = 0
	}
}

// startDelta opens a delta-credit transaction (FIG. 10, 11A): +k grants k
// credits (taken from the server-wide budget, their receives posted before
// the message goes out), −n asks the client to give n back. It reports
// whether a transaction was started.
//
// The balancer calls it from its own goroutine, so it may meet a teardown:
// a connection that is ending (c.err set, which teardown does before it
// waits for c.reqs) starts nothing, and the transaction is counted in
// c.reqs under the same lock before anything else — else its goroutine
// could start after teardown's wait and its credits' budget be added after
// teardown gave the connection's back.
func (c *conn) startDelta(delta int) bool {
	if delta == 0 {
		return false
	}
	c.mu.Lock()
	if c.err != nil || c.state == stateClosed {
		c.mu.Unlock()
		return false
	}
	c.reqs.Add(1)
	c.mu.Unlock()
	started := false
	defer func() {
		if !started {
			c.reqs.Done()
		}
	}()
	if delta > 0 {
		k := c.s.budget.Take(delta)
		if k == 0 {
			return false
		}
		if !c.grant.StartGrant(k) {
			c.s.budget.Give(k)
			return false
		}
		c.mu.Lock()
		c.budget += k
		c.mu.Unlock()
		delta = k
	} else if !c.grant.StartRetire(-delta) {
		return false
	}
	started = true
	go func() {
		defer c.reqs.Done()
		if delta > 0 {
			if err := c.pool.addCredits(delta); err != nil {
				c.fail(fmt.Errorf("posting receives for %d credits: %w", delta, err))
				return
			}
		}
		sl, err := c.slots.get()
		if err != nil {
			c.fail(err)
			return
		}
		r := protocol.NewDeltaCredit(int32(delta))
		r.Put(sl.resp.Bytes())
		sl.wrs = append(sl.wrs[:0], transport.SendWR{
			Op:  transport.OpSend,
			SGL: sl.sgl(0, transport.Segment{Region: sl.resp, Length: protocol.StatusResponseSize}),
		})
		c.log.WithField("delta", delta).Debug("lwio: delta credit")
		c.postOrDrop(sl, sl.wrs)
	}()
	return true
}
