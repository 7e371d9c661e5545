package session

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/readturn"
)

// Who reads the client's socket.
//
// The read side is a token, c.rdMu: whoever holds it reads frames and
// delivers them (accept). A caller waiting for its answer that finds the
// token free takes it and reads the socket itself until its own answer has
// come (a turn), delivering whatever else arrives meanwhile (others'
// answers to their channels, LEASE_BREAKs to onBreak); then it gives the
// token back. At queue depth 1 the answer thus wakes the caller straight
// from the socket: no reader goroutine reads it first and hands it over,
// which cost a goroutine hand-off (and the runtime's wake-up of an idle
// thread for it) on every round trip — 6.5 µs p50, 12 µs p90 of a
// two-process GETATTR round trip here (docs/session.md).
//
// The reader goroutine (readLoop) takes the token whenever it is free,
// reads one frame and delivers it; when that frame woke a waiting caller
// it steps aside for as long as callers keep reading (readYield after the
// last turn), so the next request's caller finds the token free. Nothing
// depends on a caller reading: a caller that cannot take the token waits
// for its channel, and the one whose turn ends while callers still wait
// hands the socket on (c.kick, which a waiting caller takes), as does
// the reader goroutine when the frame it read woke one caller while
// others wait. What the server sends unasked (a LEASE_BREAK) while nobody
// reads waits at most readYield for the reader goroutine.
//
// A turn ends when its caller's context does, wherever it is: blocked in
// read(2) (readturn.Intr cuts the read short with a past read deadline, cleared
// before anyone reads again) or between frames. A frame cut short stays in
// the frameReader for the next reader.

// readYield is how long the reader goroutine leaves the socket to callers
// after the last turn ended (Client.yield: tests lengthen it).
const readYield = time.Millisecond

// frameReader reads frames from a connection; a read that fails (an
// interrupted turn's timeout) loses nothing: what was read of a frame
// stays for the next call. Owned by the holder of the read token.
type frameReader struct {
	nc   net.Conn
	buf  []byte // read ahead: often the length, the frame and the next ones in one read(2)
	r, w int    // buf[r:w] is read but not yet taken
	cur  []byte // the frame being read, len its Length (cap + tagSize, to open it in place)
	got  int    // bytes of cur read
}

func newFrameReader(nc net.Conn) *frameReader {
	return &frameReader{nc: nc, buf: make([]byte, readBufferSize)}
}

// next returns the next whole frame and its bytes. A Length below the
// header or above MaxFrameSize is an error before anything is allocated.
func (rd *frameReader) next() (Frame, []byte, error) {
	for rd.cur == nil {
		if rd.w-rd.r >= 4 {
			cur, err := incomingFrame(binary.LittleEndian.Uint32(rd.buf[rd.r:]), MaxFrameSize)
			if err != nil {
				return Frame{}, nil, err
			}
			rd.cur, rd.got = cur, 0
			break
		}
		if err := rd.fill(); err != nil {
			return Frame{}, nil, err
		}
	}
	for {
		k := copy(rd.cur[rd.got:], rd.buf[rd.r:rd.w])
		rd.r += k
		rd.got += k
		if rd.got == len(rd.cur) {
			raw := rd.cur
			rd.cur = nil
			f, err := DecodeFrame(raw)
			return f, raw, err
		}
		if len(rd.cur)-rd.got >= len(rd.buf) {
			// A large body goes straight into the frame.
			n, err := rd.nc.Read(rd.cur[rd.got:])
			rd.got += n
			if n == 0 {
				return Frame{}, nil, readErr(err)
			}
			continue
		}
		if err := rd.fill(); err != nil {
			return Frame{}, nil, err
		}
	}
}

// fill reads what the connection has into buf; an error only when nothing
// came.
func (rd *frameReader) fill() error {
	if rd.r > 0 {
		rd.w = copy(rd.buf, rd.buf[rd.r:rd.w])
		rd.r = 0
	}
	n, err := rd.nc.Read(rd.buf[rd.w:])
	rd.w += n
	if n > 0 {
		return nil
	}
	return readErr(err)
}

// readErr is the error of a read that returned nothing: EOF in the middle
// of a frame is unexpected.
func readErr(err error) error {
	if err == nil {
		return io.ErrNoProgress
	}
	return err
}

// errTurnOver: a turn's context ended before its answer came.
var errTurnOver = errors.New("session: turn interrupted")

// readOne reads one frame and delivers it; the caller holds the read
// token. A frame or connection error fails the connection (and is
// returned); an interrupted turn's read returns errTurnOver and leaves the
// connection as it was. woke reports whether the frame went to a waiting
// caller.
func (c *Client) readOne(intr bool) (woke bool, err error) {
	if intr && !c.intr.Enter() {
		return false, errTurnOver
	}
	f, raw, err := c.rd.next()
	if intr && c.intr.Leave() && errors.Is(err, os.ErrDeadlineExceeded) {
		return false, errTurnOver
	}
	if err != nil {
		select {
		case <-c.done:
		default:
			if errors.Is(err, ErrShortFrame) || errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBadMagic) ||
				errors.Is(err, ErrBadFlags) || errors.Is(err, ErrBadReserved) {
				c.log.WithError(err).Warn("dropping connection: malformed frame")
			} else {
				c.log.WithError(err).Debug("connection lost")
			}
		}
		c.fail(err)
		return false, err
	}
	woke, err = c.accept(f, raw)
	if err != nil {
		c.log.WithError(err).WithFields(logrus.Fields{"msgid": f.MessageID, "cmd": f.Command}).Warn("dropping connection")
		c.fail(err)
	}
	return woke, err
}

// readLoop is the reader goroutine: it reads whenever no caller does, and
// steps aside after waking one (see above).
func (c *Client) readLoop() {
	var yield *time.Timer
	defer func() {
		if yield != nil {
			yield.Stop()
		}
	}()
	for {
		c.rdMu.Lock()
		select {
		case <-c.done:
			c.rdMu.Unlock()
			return
		default:
		}
		woke, err := c.readOne(false)
		c.rdMu.Unlock()
		if err != nil {
			return
		}
		if !woke {
			continue
		}
		if c.waiting.Load() > 0 {
			// The frame woke one caller; others wait for theirs with
			// nobody reading: hand the socket to one of them (checked
			// after the unlock: a caller that found the token taken
			// counted itself before).
			signal(c.kick)
		}
		if !c.yieldRead(&yield) {
			return
		}
	}
}

// yieldRead leaves the socket to callers for as long as they keep taking
// turns; false when the connection is gone. It does not take c.kick: a
// kick is sent only while callers wait, for one of them (taking it here
// would take the token from the caller the reader's own kick was for, or,
// the kick being stale — its caller was woken just before — from the next
// caller).
func (c *Client) yieldRead(t **time.Timer) bool {
	return readturn.StepAside(t, time.Duration(c.yield.Load()), &c.lastTurn, nil, c.done)
}

// await returns the answer that arrives on ch: read by the caller itself
// when the read token is free, else by whoever holds it. The error is
// ctx's when it ended first, the connection's when that failed first.
func (c *Client) await(ctx context.Context, ch chan Frame) (Frame, error) {
	kicked := false
	for {
		select {
		case f := <-ch:
			if kicked && c.waiting.Load() > 0 {
				signal(c.kick) // pass on the token this caller was handed
			}
			return f, nil
		default:
		}
		c.waiting.Add(1)
		if c.rdMu.TryLock() {
			c.waiting.Add(-1)
			err := c.turn(ctx, ch)
			c.lastTurn.Store(time.Now().UnixNano())
			c.rdMu.Unlock()
			if c.waiting.Load() > 0 {
				signal(c.kick)
			}
			if err != nil && len(ch) == 0 {
				if err == errTurnOver {
					return Frame{}, ctx.Err()
				}
				return Frame{}, c.Err()
			}
			c.ownReads.Add(1)
			continue
		}
		var gone error
		select {
		case f := <-ch:
			c.waiting.Add(-1)
			return f, nil
		case <-c.kick:
			// The token was handed on; take it, or pass it on.
			c.waiting.Add(-1)
			kicked = true
			continue
		case <-ctx.Done():
			gone = ctx.Err()
		case <-c.done:
			gone = c.Err()
		}
		c.waiting.Add(-1)
		// The response may have been delivered just before ctx or the
		// connection ended (LOGOFF is answered, then closed).
		select {
		case f := <-ch:
			return f, nil
		default:
			return Frame{}, gone
		}
	}
}

// turn is a caller holding the read token: it reads until ch has its
// answer, ctx ends (errTurnOver) or the connection fails.
func (c *Client) turn(ctx context.Context, ch chan Frame) error {
	select {
	case <-c.done:
		return ErrClosed
	default:
	}
	if ctx.Done() == nil {
		for len(ch) == 0 {
			if _, err := c.readOne(false); err != nil {
				return err
			}
		}
		return nil
	}
	defer c.intr.End(c.intr.BeginCtx(ctx))
	for len(ch) == 0 {
		if _, err := c.readOne(true); err != nil {
			return err
		}
	}
	return nil
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
