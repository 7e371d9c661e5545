package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

// Per-connection layout.
const (
	// maxSlots bounds the requests a connection has in flight, counting
	// those whose SEND completion is still to be reaped; it is also the
	// send queue depth, so a post never overflows.
	maxSlots = 256
	// maxVecRegions is the most RDMA_REGIONs one VEC_READ carries (1 MiB
	// of 4 KiB pages).
	maxVecRegions = 256
	// sendAreaSize is a slot's registered send area: the header and the
	// region list of a vectored read, or a small write's data.
	sendAreaSize = protocol.HeaderSize + maxVecRegions*protocol.RDMARegionSize
	// inlineWrite: writes up to this size are copied behind the header
	// and go out as one segment.
	inlineWrite = sendAreaSize - protocol.HeaderSize
	// A slot's remote-writable area: the IO_STATUS_BLOCK of a polling
	// request at 0, the bounce buffer for small reads at bounceOff.
	bounceOff      = 64
	bounceSize     = 1024
	remoteAreaSize = bounceOff + bounceSize
	// recvSize is each posted receive: a STATUS_RESPONSE (or a WRITE WITH
	// IMMEDIATE, which carries no bytes) with room to spare.
	recvSize = 64
	// authBufSize receives the server's AUTH parameters (FIG. 6B).
	authBufSize = 256
	// maxSpinners is how many polling requests of a connection spin at
	// once.
	maxSpinners = 2
	// authID is the work request ID of the AUTH send.
	authID = 1 << 62
	// fragID marks the SENDs of a fragmented write before its last (whose
	// ID is the slot's): their completions only count as owed ones.
	fragID = 1 << 61
	// maxFragments is the most messages one write is sent in: their
	// headers live in the slot's send area.
	maxFragments = sendAreaSize / protocol.HeaderSize
)

// errAuth marks a connection the server, or the client's check of the
// server, refused: authentication fails closed.
var errAuth = errors.New("lwio client: authentication failed")

// conn is one authenticated connection.
type conn struct {
	cl  *Client
	tc  transport.Conn
	log logrus.FieldLogger

	credits    *protocol.Credits
	pool       *transport.BufferPool
	maxRead    int
	maxWrite   int
	maxRegions int
	serverPage int
	fragData   int // data bytes one of the server's receive buffers holds

	slots  [maxSlots]atomic.Pointer[slot]
	nslots atomic.Int32
	free   chan *slot

	recvRegion transport.Region
	recvMu     sync.Mutex
	recvFree   []int
	recvExcess int
	recvWRs    [1]transport.RecvWR // postRecv's list, under recvMu

	// The reaper role (see reap.go): whoever holds reaping polls the CQ
	// and dispatches every completion in it. expect counts the CQ events
	// requests are owed (SEND completions, interrupt-mode answers).
	reaping atomic.Bool
	expect  atomic.Int32
	// lastPolled: the connection's last I/O request was a polling one,
	// so the background reaper keeps the role (see reap.go).
	lastPolled atomic.Bool
	reapKick   chan struct{}            // one slot: wakes the background reaper
	idlePoll   [2]time.Duration         // idlePoll and idlePollMax when the connection was made
	wcs        [64]transport.Completion // the role holder's batch
	// dying: a receive could not be reposted (the transport is closing).
	// The connection ends once the role holder's batch is dispatched, not
	// at once: answers in the batch reach their requesters as answers, not
	// as a lost connection. Only the role holder touches it.
	dying error

	spinners  atomic.Int32  // polling requests spinning now
	spinScore atomic.Int32  // > 0 while recent spins mostly succeeded
	spinSkips atomic.Uint32 // polling requests that did not spin; every 64th spins anyway (shouldSpin)

	intrMu  sync.Mutex
	intrOut bool
	wake    chan struct{} // closed when an INTERRUPT completes

	auto autoState    // the Auto completion mode's decision (auto.go)
	ctr  connCounters // this connection's figures (stats.go)

	dieOnce      sync.Once
	counted      atomic.Bool // one of Client.conns: its death counts toward Done
	deathCounted atomic.Bool
	dead         chan struct{}
	err          error
}

func (c *conn) alive() bool { return !closed(c.dead) }

// closed reports whether ch is closed (nothing is ever sent on it).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// die ends the connection: every waiting request fails at once.
func (c *conn) die(err error) {
	c.dieOnce.Do(func() {
		c.err = err
		close(c.dead)
		if c.credits != nil {
			c.credits.Close(&protocol.ConnectionError{Conn: c.name(), Err: err})
		}
		c.tc.Close()
		if !errors.Is(err, ErrClosed) {
			c.log.WithError(err).Warn("lwio: connection lost")
		}
		if c.counted.Load() {
			c.countDeath()
		}
	})
}

// countDeath reports the connection's death to the Client once.
func (c *conn) countDeath() {
	if c.deathCounted.CompareAndSwap(false, true) {
		c.cl.connDied(c.err)
	}
}

func (c *conn) name() string { return c.tc.Provider() + " " + c.tc.RemoteAddr() }

// connErr is the error of a request whose connection died: its scope is
// the connection (protocol.ConnectionError), the remedy a new Client.
func (c *conn) connErr() error { return &protocol.ConnectionError{Conn: c.name(), Err: c.err} }

// dial connects to addr and authenticates (FIG. 5, 6A–C).
func dial(ctx context.Context, cl *Client, idx int, p transport.Provider, addr string, key [16]byte) (*conn, error) {
	cfg := &cl.cfg
	tcfg := cfg.Transport
	tcfg.SendQueueDepth = cmp.Or(tcfg.SendQueueDepth, maxSlots+8)
	tcfg.RecvQueueDepth = cmp.Or(tcfg.RecvQueueDepth, cfg.MaxCredits+8)
	tc, err := p.Dial(ctx, addr, tcfg)
	if err != nil {
		return nil, err
	}
	c := &conn{
		cl:       cl,
		tc:       tc,
		log:      cl.log.WithFields(logrus.Fields{"conn": idx, "provider": tc.Provider(), "remote": tc.RemoteAddr()}),
		free:     make(chan *slot, maxSlots),
		reapKick: make(chan struct{}, 1),
		idlePoll: [2]time.Duration{idlePoll, idlePollMax},
		wake:     make(chan struct{}),
		dead:     make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			tc.Close()
			if c.recvRegion != nil {
				c.recvRegion.Deregister()
			}
		}
	}()
	c.ctr.init(cl.ctr, tc.Provider())
	dom := tc.Domain()
	nrecv := cfg.MaxCredits + 2
	if c.recvRegion, err = dom.Alloc(nrecv*recvSize, transport.AccessLocal); err != nil {
		return nil, err
	}
	for i := nrecv - 1; i >= 0; i-- {
		c.recvFree = append(c.recvFree, i)
	}
	// N+1 receives for the N credits asked for: the server grants no more.
	if err := c.addRecv(cfg.Credits + 1); err != nil {
		return nil, err
	}
	authBuf, err := dom.Alloc(authBufSize, transport.AccessLocal|transport.AccessRemoteWrite)
	if err != nil {
		return nil, err
	}
	defer authBuf.Deregister()
	sendBuf, err := dom.Alloc(protocol.HeaderSize+protocol.AuthParamsMaxSize, transport.AccessLocal)
	if err != nil {
		return nil, err
	}
	defer sendBuf.Deregister()

	params := protocol.AuthParams{
		RevID:             protocol.RevID,
		Endian:            protocol.AuthEndian,
		PageSize:          uint16(cfg.PageSize),
		MaxRdmaWindowSize: uint32(cfg.MaxIO),
		MaxSendBufferSize: uint32(cfg.MaxIO + protocol.HeaderSize),
		MaxRecvBufferSize: recvSize,
		HeaderSize:        protocol.HeaderSize,
		Credits:           uint16(cfg.Credits),
		HasKey:            true,
		Key:               key,
	}
	sealing := cfg.Cipher != smbauth.CipherNone && transport.CanSeal(tc)
	if sealing {
		params.HasNonce = true
		if _, err := rand.Read(params.Nonce[:]); err != nil {
			return nil, err
		}
	}
	params.Sign(cfg.SigningKey)
	const cookie = 1
	req := protocol.NewAuthRequest(params, authBuf.Addr(), authBuf.Handle(), cookie)
	msg := req.Append(sendBuf.Bytes()[:0])
	if err := tc.Post(transport.SendWR{ID: authID, Op: transport.OpSend, SGL: []transport.Segment{{Region: sendBuf, Length: len(msg)}}}); err != nil {
		return nil, err
	}
	var resp *protocol.StatusResponse
	sent := false
	var wcs [8]transport.Completion
	answered := false // the server answered, then went away (a refusal does)
	var early []transport.Completion
	for (resp == nil || !sent) && !answered {
		n, err := tc.CQ().Wait(ctx, wcs[:])
		if err != nil {
			if resp != nil {
				break
			}
			return nil, fmt.Errorf("waiting for AUTH response: %w", err)
		}
		for _, wc := range wcs[:n] {
			if err := wc.Err(); err != nil {
				if resp != nil {
					answered = true
					break
				}
				return nil, fmt.Errorf("AUTH %v: %w", wc.Op, err)
			}
			switch {
			case wc.Op == transport.OpSend && wc.ID == authID:
				sent = true
			case wc.Op == transport.OpRecv && !wc.HasImm && resp == nil:
				r, err := protocol.DecodeStatusResponse(c.recvBytes(wc.ID)[:wc.Len])
				if err != nil {
					return nil, fmt.Errorf("%w: %v", errAuth, err)
				}
				resp = &r
				// A failed repost (dying) is reported once the answer
				// is read: a server that refuses closes the connection
				// at once, and the refusal, not the lost connection, is
				// the reason.
				c.recvDone(wc.ID)
			case wc.Op == transport.OpRecv && !wc.HasImm:
				// A delta credit can follow the response before our
				// AUTH send's completion: handled once the credits are
				// set up, below.
				early = append(early, wc)
			default:
				return nil, fmt.Errorf("%w: unexpected %v completion during AUTH", errAuth, wc.Op)
			}
		}
	}
	if resp.Cookie != cookie {
		return nil, fmt.Errorf("%w: response cookie %d", errAuth, resp.Cookie)
	}
	if resp.Ios.Status != protocol.StatusSuccess {
		if cfg.Cipher != smbauth.CipherNone && !sealing {
			return nil, fmt.Errorf("%w: server said %v: the session is sealed and %s connections cannot seal, so the server refuses them unless its fabric is trusted (trusted_fabric); use provider=softrdma or auto", errAuth, resp.Ios.Status, tc.Provider())
		}
		return nil, fmt.Errorf("%w: server said %v", errAuth, resp.Ios.Status)
	}
	if c.dying != nil {
		return nil, c.dying
	}
	// FIG. 6B: the server's parameters, checked before anything else is
	// trusted: its Key, our SessionId, its signature with the session key.
	sp, n, err := protocol.DecodeAuthParamsPrefix(authBuf.Bytes())
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: server parameters: %v", errAuth, err)
	case int(resp.Ios.Information) != n+protocol.AuthInformationExtra:
		return nil, fmt.Errorf("%w: Information %d for %d bytes of parameters", errAuth, resp.Ios.Information, n)
	case !sp.HasKey || sp.Key != key:
		return nil, fmt.Errorf("%w: server Key does not match the negotiate", errAuth)
	case !sp.HasSessionID || sp.SessionID != cfg.SessionID:
		return nil, fmt.Errorf("%w: server SessionId %d, want %d", errAuth, sp.SessionID, cfg.SessionID)
	case !sp.Verify(cfg.SigningKey):
		return nil, fmt.Errorf("%w: bad server signature", errAuth)
	case sp.HeaderSize != protocol.HeaderSize:
		return nil, fmt.Errorf("%w: server HeaderSize %d", errAuth, sp.HeaderSize)
	case sp.BaseSequence != params.BaseSequence+1:
		return nil, fmt.Errorf("%w: server BaseSequence %d", errAuth, sp.BaseSequence)
	case sp.Credits == 0 || int(sp.Credits) > cfg.Credits:
		return nil, fmt.Errorf("%w: server granted %d credits, asked %d", errAuth, sp.Credits, cfg.Credits)
	case sp.MaxRecvBufferSize <= protocol.HeaderSize || sp.MaxRdmaWindowSize == 0:
		return nil, fmt.Errorf("%w: server limits %d/%d", errAuth, sp.MaxRecvBufferSize, sp.MaxRdmaWindowSize)
	}
	if err := c.startSeal(&params, &sp, sealing); err != nil {
		return nil, err
	}
	granted := int(sp.Credits)
	c.recvMu.Lock()
	c.recvExcess = cfg.Credits - granted
	c.recvMu.Unlock()
	c.credits = protocol.NewCredits(granted)
	c.maxRead = min(int(sp.MaxRdmaWindowSize), cfg.MaxIO)
	// A write longer than one of the server's receive buffers goes
	// fragmented (write.go), a message per buffer, up to the server's
	// largest transfer and the headers the slot's send area holds.
	c.fragData = protocol.FragmentData(int(sp.MaxRecvBufferSize))
	c.maxWrite = min(cfg.MaxIO, int(sp.MaxRdmaWindowSize), maxFragments*c.fragData)
	// A VEC_READ's region list must fit the server's receive buffer too.
	c.maxRegions = max(min(maxVecRegions, c.fragData/protocol.RDMARegionSize), 1)
	c.serverPage = int(sp.PageSize)
	c.spinScore.Store(4)
	c.pool = transport.NewBufferPool(dom, transport.AccessLocal|transport.AccessRemoteWrite, max(c.maxRead, c.maxWrite))
	if cfg.PoolMemory > 0 {
		c.pool.SetKeep(max(cfg.PoolMemory/cfg.Connections, c.maxRead, c.maxWrite))
	}
	for i := range early {
		c.onRecv(&early[i])
	}
	if c.dying != nil {
		return nil, c.dying
	}
	ok = true
	return c, nil
}

func (c *conn) recvBytes(id uint64) []byte {
	off := int(id) * recvSize
	return c.recvRegion.Bytes()[off : off+recvSize]
}

func (c *conn) recvWR(id int) transport.RecvWR {
	return transport.RecvWR{ID: uint64(id), Buf: transport.Segment{Region: c.recvRegion, Offset: id * recvSize, Length: recvSize}}
}

// addRecv posts n more receives, first cancelling surplus still posted.
func (c *conn) addRecv(n int) error {
	c.recvMu.Lock()
	absorb := min(n, c.recvExcess)
	c.recvExcess -= absorb
	n -= absorb
	if n > len(c.recvFree) {
		c.recvMu.Unlock()
		return fmt.Errorf("lwio client: %d receives wanted, %d left", n, len(c.recvFree))
	}
	ids := c.recvFree[len(c.recvFree)-n:]
	c.recvFree = c.recvFree[:len(c.recvFree)-n]
	c.recvMu.Unlock()
	for i := len(ids) - 1; i >= 0; i-- {
		if err := c.postRecv(ids[i]); err != nil {
			return err
		}
	}
	return nil
}

// postRecv posts receive id from a reused one-element list: a variadic
// call through the interface would allocate its slice every time.
func (c *conn) postRecv(id int) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	c.recvWRs[0] = c.recvWR(id)
	return c.tc.PostRecv(c.recvWRs[:]...)
}

// recvDone reposts a consumed receive, or parks it when more are posted
// than credits+1 (credits were retired). A failed repost sets dying: the
// completion it came with is still handed over.
func (c *conn) recvDone(id uint64) {
	c.recvMu.Lock()
	if c.recvExcess > 0 {
		c.recvExcess--
		c.recvFree = append(c.recvFree, int(id))
		c.recvMu.Unlock()
		return
	}
	c.recvMu.Unlock()
	if err := c.postRecv(int(id)); err != nil && c.dying == nil {
		c.dying = fmt.Errorf("repost receive: %w", err)
	}
}

func (c *conn) onRecv(wc *transport.Completion) {
	if wc.HasImm {
		// FIG. 14A/16A with seed 002: the immediate data on the last
		// segment completes a full read.
		c.recvDone(wc.ID)
		sl := c.slotAt(int(wc.Imm & 0xFFFF))
		if sl == nil || uint32(sl.cookie.Load()) != wc.Imm || sl.kind != kindIO || sl.polling {
			c.die(fmt.Errorf("protocol violation: immediate data %#x names no request", wc.Imm))
			return
		}
		c.expect.Add(-1)
		c.complete(sl, result{info: sl.reqLen, st: protocol.StatusSuccess})
		return
	}
	if wc.Len != protocol.StatusResponseSize {
		c.die(fmt.Errorf("protocol violation: %d-byte message from the server", wc.Len))
		return
	}
	r, err := protocol.DecodeStatusResponse(c.recvBytes(wc.ID)[:wc.Len])
	c.recvDone(wc.ID)
	if err != nil {
		c.die(err)
		return
	}
	if r.IsDeltaCredit() {
		c.delta(r.CreditDelta())
		return
	}
	sl := c.slotAt(int(r.Cookie & 0xFFFF))
	if sl == nil || sl.cookie.Load() != r.Cookie || sl.polling {
		c.die(fmt.Errorf("protocol violation: response cookie %#x names no request", r.Cookie))
		return
	}
	c.expect.Add(-1)
	c.complete(sl, result{info: r.Ios.Information, st: r.Ios.Status})
}

// complete hands a completion to its request. The credit goes back first:
// the server already counts it free. A second answer to one request (a
// hostile or broken server) ends the connection before it touches the
// credits: giving them back twice would panic (more back than charged) or
// let the client send beyond what the server granted. Only complete, in
// the reaper role, moves a slot on from Waiting or Abandoned (the
// requester's move from Waiting to Abandoned keeps it answerable).
func (c *conn) complete(sl *slot, res result) {
	if s := sl.state.Load(); s != slotWaiting && s != slotAbandoned {
		c.die(fmt.Errorf("protocol violation: second completion for cookie %#x (slot %v)", sl.cookie.Load(), s))
		return
	}
	if sl.kind == kindRetire && res.st == protocol.NotifyCredit {
		c.credits.Retire()
		c.recvMu.Lock()
		c.recvExcess++ // one receive fewer from now on
		c.recvMu.Unlock()
	} else {
		c.credits.ReleaseN(sl.ncred)
	}
	if sl.kind == kindIO {
		c.rang() // not polling: onRecv refuses a completion for a polling request
	}
	if sl.kind == kindInterrupt {
		c.intrMu.Lock()
		c.intrOut = false
		close(c.wake)
		c.wake = make(chan struct{})
		c.intrMu.Unlock()
	}
	for {
		switch s := sl.state.Load(); s {
		case slotWaiting:
			if pw := sl.pw; pw != nil {
				if !sl.state.CompareAndSwap(slotWaiting, slotFinished) {
					continue
				}
				pw.res = res
				close(pw.answered) // the poster let go after the post
				break
			}
			if !sl.state.CompareAndSwap(slotWaiting, slotDone) {
				continue
			}
			sl.done <- res
		case slotAbandoned:
			if !sl.state.CompareAndSwap(slotAbandoned, slotFinished) {
				continue
			}
			sl.unref() // for the requester that left
		default:
			c.die(fmt.Errorf("protocol violation: second completion for cookie %#x (slot %v)", sl.cookie.Load(), s))
			return
		}
		break
	}
	sl.unref()
}

// delta handles a server delta-credit message (FIG. 11A).
func (c *conn) delta(d int32) {
	switch {
	case d > 0:
		k := int(d)
		use := min(k, max(0, c.cl.cfg.MaxCredits-c.credits.Limit()))
		// N+1 receives for N credits before the credits are used.
		if err := c.addRecv(use); err != nil {
			c.die(err)
			return
		}
		c.credits.Loan(use)
		go c.sendCredit(int32(k-use), kindCredit)
	case d < 0:
		go func() {
			for v := d; v < 0; v++ {
				if !c.sendCredit(v, kindRetire) {
					return
				}
			}
		}()
	}
}

// sendCredit sends one LWIO_OPCODE_CREDIT (FIG. 11B) and waits for its
// completion (FIG. 11C).
func (c *conn) sendCredit(v int32, kind slotKind) bool {
	ctx := context.Background()
	if err := c.credits.ChargeUrgent(ctx); err != nil {
		return false
	}
	sl, err := c.getSlot(ctx)
	if err != nil {
		c.credits.Release()
		return false
	}
	sl.ncred = 1
	h := protocol.NewCreditRequest(v, c.hint(), c.prepare(sl, kind, 0).Cookie)
	if _, err = c.roundTrip(ctx, sl, &h, protocol.HeaderSize, nil); err != nil {
		return false
	}
	sl.unref() // the requester's reference: kept, every handshake would hold a slot for good
	return true
}

func (c *conn) hint() uint8 { return uint8(min(c.credits.Pending(), 255)) }

// roundTrip posts the request whose header is h (built by a protocol
// constructor with prepare's Completion; the first hdrLen bytes of the send
// area are sent, then data if any) and waits for its completion. The
// caller has charged a credit.
func (c *conn) roundTrip(ctx context.Context, sl *slot, h *protocol.Header, hdrLen int, data *transport.Segment) (result, error) {
	start, polling, payload := time.Now(), sl.polling, hdrLen-protocol.HeaderSize
	if data != nil {
		payload += data.Length
	}
	if err := c.post(sl, h, hdrLen, data); err != nil {
		return result{}, err
	}
	r, err := c.wait(ctx, sl)
	c.count(h.Opcode, polling, payload, r, err, start)
	return r, err
}

// post sends sl's request: hdrLen bytes of its send area, then data. data
// is a write's (writeArea: the slot's pooled buffer, kept until the
// answer), so the SEND is lent (write.go, lendWrite).
func (c *conn) post(sl *slot, h *protocol.Header, hdrLen int, data *transport.Segment) error {
	h.Put(sl.send.Bytes())
	sl.segs[0] = transport.Segment{Region: sl.send, Length: hdrLen}
	sgl := sl.segs[:1]
	if data != nil {
		sl.segs[1] = *data
		sgl = sl.segs[:2]
	}
	sl.wr[0] = transport.SendWR{ID: uint64(sl.idx), Op: transport.OpSend, SGL: sgl, Lend: data != nil}
	return c.postChain(sl, sl.wr[:])
}

// postChain posts sl's request as the SENDs wrs (one, or a fragmented
// write's messages in a row: a chain, so nothing of the connection's
// comes between them); the last carries the slot's completion ID.
func (c *conn) postChain(sl *slot, wrs []transport.SendWR) error {
	sl.refs.Store(3)
	sl.state.Store(slotWaiting)
	owed := int32(len(wrs)) // the SENDs' completions
	if !sl.polling {
		owed++ // and the answer
	}
	bell := sl.kind == kindIO && !sl.polling
	if bell {
		c.auto.doorbells.Add(1)
	}
	c.expect.Add(owed)
	if sl.kind == kindIO && sl.polling != c.lastPolled.Load() {
		c.lastPolled.Store(sl.polling)
	}
	if err := c.tc.Post(wrs...); err != nil {
		if len(wrs) > 1 {
			// A chain may have been posted in part (ibv_post_send
			// stops at the work request it rejects): the adapter may
			// still read the slot's headers and its data buffer, and
			// completions are owed for what went. Nothing is rolled
			// back and the slot is not reused: the connection ends
			// (its transport closed before die returns) and the slot
			// goes with it.
			c.die(fmt.Errorf("post: %w", err))
			return c.connErr()
		}
		c.expect.Add(-owed)
		if bell {
			c.auto.doorbells.Add(-1)
		}
		sl.state.Store(slotIdle)
		sl.refs.Store(0)
		c.credits.ReleaseN(sl.ncred)
		c.freeSlot(sl)
		if !c.alive() {
			return c.connErr()
		}
		c.die(fmt.Errorf("post: %w", err))
		return c.connErr()
	}
	if (sl.polling || sl.pw != nil) && !c.reaping.Load() {
		// The background reaper takes the role: lastPolled, or a posted
		// write nobody waits for yet (reap.go).
		signal(c.reapKick)
	}
	return nil
}

// wait waits for sl's completion. On a nil error the caller owns the slot's
// data until it calls sl.unref.
func (c *conn) wait(ctx context.Context, sl *slot) (result, error) {
	if sl.polling {
		return c.waitPoll(ctx, sl)
	}
	if c.reaping.CompareAndSwap(false, true) {
		if r, ok := c.reapUntilDone(ctx, sl); ok {
			return r, nil
		}
	}
	select {
	case r := <-sl.done:
		return r, nil
	case <-ctx.Done():
		if sl.state.CompareAndSwap(slotWaiting, slotAbandoned) {
			return result{}, ctx.Err()
		}
		return <-sl.done, nil
	case <-c.dead:
		// The answer may have come with the batch that ended it.
		select {
		case r := <-sl.done:
			return r, nil
		default:
			return result{}, c.connErr()
		}
	}
}
