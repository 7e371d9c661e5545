package server

import (
	"fmt"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/transport"
)

// authParamsOff is where a slot's registered area holds the server's
// LWIO_AUTH_PARAMS while they are RDMA-written (FIG. 6B).
const authParamsOff = 32

// auth handles the connection's first message, AUTH (FIG. 5, 6A–C). It runs
// on the reaper: nothing else can be outstanding yet. On success the server
// RDMA-writes its own parameters to DataVa/DataMh, posts the receives for
// the credits it grants, and sends the STATUS_RESPONSE; on failure it sends
// STATUS_ACCESS_DENIED and the connection ends.
func (c *conn) auth(h *protocol.Header, msg []byte) {
	sl, err := c.slots.get()
	if err != nil {
		c.fail(err)
		return
	}
	sl.hdr = *h
	deny := func(why string, st protocol.Status) {
		c.log.WithField("reason", why).Warn("lwio: authentication refused")
		sl.wrs = append(sl.wrs[:0], c.statusWR(sl, h.Cookie(), st, 0))
		c.mu.Lock()
		c.endAfter = sl.idx + 1
		c.mu.Unlock()
		c.postOrDrop(sl, sl.wrs)
	}
	p, err := protocol.DecodeAuthParams(msg[protocol.HeaderSize:])
	if err != nil {
		deny(err.Error(), protocol.StatusAccessDenied)
		return
	}
	if int(h.Length) != len(msg) {
		deny(fmt.Sprintf("Length %d for a %d-byte message", h.Length, len(msg)), protocol.StatusAccessDenied)
		return
	}
	if p.HeaderSize != protocol.HeaderSize {
		deny(fmt.Sprintf("HeaderSize %d, want %d", p.HeaderSize, protocol.HeaderSize), protocol.StatusAccessDenied)
		return
	}
	if !p.HasKey || !p.HasSignature {
		deny("Key or Signature option missing", protocol.StatusAccessDenied)
		return
	}
	id, key, ok := c.s.cfg.Authority.SessionByKey(p.Key)
	if !ok {
		deny("unknown Key", protocol.StatusAccessDenied)
		return
	}
	if !p.Verify(key) {
		deny("bad Signature", protocol.StatusAccessDenied)
		return
	}
	if p.HasSessionID && p.SessionID != id {
		deny("SessionId of another session", protocol.StatusAccessDenied)
		return
	}
	if !c.s.claimKey(p.Key) {
		deny("Key already authenticated a connection (replayed AUTH?)", protocol.StatusAccessDenied)
		return
	}
	want := int(p.Credits)
	if want <= 0 || want > c.s.cfg.Credits {
		want = c.s.cfg.Credits
	}
	granted := c.s.budget.Take(want)
	if granted == 0 {
		deny("server credit budget exhausted", protocol.StatusInsufficientResources)
		return
	}
	c.mu.Lock()
	c.budget = granted
	c.peerPage = int(p.PageSize)
	c.mu.Unlock()
	if err := c.addRecv(granted); err != nil {
		c.fail(fmt.Errorf("posting receives: %w", err))
		c.slots.put(sl.idx)
		return
	}
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
	}
	sp.Sign(key)
	enc := sp.Append(sl.resp.Bytes()[authParamsOff:authParamsOff])
	c.grant = protocol.NewCreditGrant(granted)
	sess := c.s.attach(id, key)
	c.mu.Lock()
	c.sess = sess
	c.state = stateOpen
	c.mu.Unlock()
	sl.ensureSegs(2)
	sl.segs[0] = transport.Segment{Region: sl.resp, Offset: authParamsOff, Length: len(enc)}
	r := protocol.NewAuthResponse(h.Cookie(), &sp, protocol.StatusSuccess)
	r.Put(sl.resp.Bytes())
	sl.segs[1] = transport.Segment{Region: sl.resp, Length: protocol.StatusResponseSize}
	sl.wrs = append(sl.wrs[:0],
		transport.SendWR{Op: transport.OpWrite, SGL: sl.segs[0:1:1], RemoteAddr: h.DataVa, RKey: h.DataMh},
		transport.SendWR{Op: transport.OpSend, SGL: sl.segs[1:2:2]},
	)
	c.log.WithFields(map[string]any{"session": id, "credits": granted}).Info("lwio: connection authenticated")
	c.postOrDrop(sl, sl.wrs)
}

// execControl runs REGISTER, CLOSE, CANCEL and a repeated AUTH; each completes with a STATUS_RESPONSE send.
func (c *conn) execControl(sl *slot) {
	defer c.reqs.Done()
	h := &sl.hdr
	switch h.Opcode {
	case protocol.OpRegister:
		c.register(sl)
	case protocol.OpClose:
		// FIG. 12A/B: later requests on the Fid fail; queued ones are
		// cancelled, executing ones finish.
		e := c.sess.unregister(h.Fid)
		if e == nil {
			c.completeControl(sl, protocol.StatusInvalidHandle, 0, false)
			return
		}
		e.mu.Lock()
		e.closed = true
		e.mu.Unlock()
		e.cancel()
		c.completeControl(sl, protocol.StatusSuccess, 0, false)
	case protocol.OpCancel:
		// FIG. 13A/B: queued requests complete with STATUS_CANCELLED.
		e := c.sess.lookup(h.Fid)
		if e == nil {
			c.completeControl(sl, protocol.StatusInvalidHandle, 0, false)
			return
		}
		e.cancel()
		c.completeControl(sl, protocol.StatusSuccess, 0, false)
	case protocol.OpAuth:
		c.completeControl(sl, protocol.StatusAccessDenied, 0, false)
	}
}

// register handles REGISTER (FIG. 7A/B): the resume key must resolve on the
// connection's own session; the Fid returned is scoped to that session.
func (c *conn) register(sl *slot) {
	fp, err := protocol.DecodeFidParams(sl.msg[protocol.HeaderSize:])
	if err != nil {
		c.completeControl(sl, protocol.StatusInvalidParameter, 0, false)
		return
	}
	if fp.SessionID != c.sess.id {
		c.completeControl(sl, protocol.StatusAccessDenied, 0, false)
		return
	}
	f, err := c.s.cfg.Authority.OpenByResumeKey(c.sess.id, [24]byte(fp.ResumeKey))
	if err != nil {
		st := statusOf(err)
		if st == protocol.StatusIOError {
			st = protocol.StatusInvalidHandle
		}
		c.completeControl(sl, st, 0, false)
		return
	}
	fid, ok := c.sess.register(f, fp.FlagsAndAttributes)
	if !ok {
		c.completeControl(sl, protocol.StatusInsufficientResources, 0, false)
		return
	}
	c.log.WithField("fid", fid).Debug("lwio: file registered")
	c.completeControl(sl, protocol.StatusSuccess, uint32(fid), false)
}

// ordered decides CREDIT (FIG. 11B/C) and INTERRUPT (FIG. 9A/B) requests
// on the reaper, in arrival order, and answers them from a goroutine (or,
// for a held INTERRUPT, at the next I/O completion). c.reqs was added for sl.
func (c *conn) ordered(sl *slot) {
	answer := func(st protocol.Status, retire bool) {
		go func() {
			defer c.reqs.Done()
			c.completeControl(sl, st, 0, retire)
		}()
	}
	if sl.hdr.Opcode == protocol.OpInterrupt {
		// Held until the next I/O completion on the connection; answered
		// at once when no I/O is outstanding, so an I/O that completed
		// just before the INTERRUPT arrived cannot leave the client
		// asleep. Only one may be outstanding.
		c.mu.Lock()
		switch {
		case c.intr != nil:
			c.mu.Unlock()
			answer(protocol.StatusInvalidDeviceRequest, false)
		case c.ioInflight == 0:
			c.mu.Unlock()
			answer(protocol.StatusSuccess, false)
		default:
			c.intr = sl
			c.mu.Unlock()
			c.reqs.Done() // completeIO answers it
		}
		return
	}
	st, released, err := c.grant.CreditMessage(sl.hdr.CreditCount())
	if err != nil {
		c.fail(err)
		c.releaseRecv(sl, false)
		c.grant.Complete()
		c.slots.put(sl.idx)
		c.reqs.Done()
		return
	}
	c.s.budget.Give(released)
	c.mu.Lock()
	c.budget -= released
	if st == protocol.StatusSuccess {
		c.recvExcess += released
	}
	c.mu.Unlock()
	answer(st, st == protocol.NotifyCredit)
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
		if !c.grant.Open() {
			c.startDelta(min(g, cfg.MaxCredits-g))
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
func (c *conn) startDelta(delta int) bool {
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
	} else if delta < 0 {
		if !c.grant.StartRetire(-delta) {
			return false
		}
	} else {
		return false
	}
	c.reqs.Add(1)
	go func() {
		defer c.reqs.Done()
		if delta > 0 {
			if err := c.addRecv(delta); err != nil {
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
