package protocol

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/lwiofs/lwiofs/internal/enum"
)

// Credits correspond to the server's posted receive buffers (seed 001,
// "Credits", FIG. 10 and 11A–C). A client holding N credits may have at most N
// requests outstanding on the connection and must have N+1 receives posted,
// the extra one for the server's delta-credit message. The server manages
// credits: it starts a three-way delta-credit transaction (at most one open per
// connection); a positive delta +k is answered by one LWIO_OPCODE_CREDIT
// message whose Offset's upper 32 bits report the credits the client will not
// use, a negative delta −N by N credit messages counting −N, −(N−1) … −1, each
// completed by a STATUS_RESPONSE with LWIO_NOTIFY_CREDIT that retires one
// credit.
//
// This file holds the accounting alone, with no I/O: Credits is the client's
// account (loan and charge, as go-smb2 keeps it), CreditGrant the server's view
// of one connection, and CreditPool the server-wide budget.

// ErrCreditViolation is returned by CreditGrant when a client breaks the credit
// rules: more requests outstanding than credits, or a credit message out of
// turn. It ends the connection.
var ErrCreditViolation = errors.New("lwio: credit violation")

// Credits is a client's credit account on one connection. It is safe for
// concurrent use. A request Charges one credit before it is sent and Releases
// it when its completion arrives; a credit message answering a negative delta
// Retires its credit instead.
type Credits struct {
	mu      sync.Mutex
	limit   int // credits held
	used    int // charged, not yet released or retired
	waiters []*creditWaiter
	err     error // set by Close
}

type creditWaiter struct {
	ch   chan error // buffered 1; receives nil when handed its credits
	n    int        // credits wanted
	done bool       // handed its credits or an error (under mu)
}

// ErrTooFewCredits is returned by ChargeN when the account holds fewer
// credits than asked for, so that waiting could never end: the caller
// sends less per request (a fragmented write in fewer fragments).
var ErrTooFewCredits = errors.New("lwio: more credits asked for than held")

// NewCredits returns an account holding n credits, none in use.
func NewCredits(n int) *Credits { return &Credits{limit: n} }

// Charge takes one credit for a request, waiting in FIFO order until one is
// free. It fails when ctx ends or the account is closed.
func (c *Credits) Charge(ctx context.Context) error { return c.charge(ctx, 1, false) }

// ChargeN takes n credits at once, for a request that uses n receive
// buffers (a fragmented write), waiting in FIFO order until all are free:
// taking them one by one could leave two such requests each holding part
// of what it needs. It fails with ErrTooFewCredits when more than the
// account's credits are asked for (or, while waiting, once a retirement
// leaves too few).
func (c *Credits) ChargeN(ctx context.Context, n int) error { return c.charge(ctx, n, false) }

// ChargeUrgent is Charge ahead of every waiting request: credit messages that
// answer the server must not queue behind the I/O they are making room for.
func (c *Credits) ChargeUrgent(ctx context.Context) error { return c.charge(ctx, 1, true) }

func (c *Credits) charge(ctx context.Context, n int, urgent bool) error {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	if n > 1 && n > c.limit {
		c.mu.Unlock()
		return ErrTooFewCredits
	}
	if c.used+n <= c.limit && (urgent || len(c.waiters) == 0) {
		c.used += n
		c.mu.Unlock()
		return nil
	}
	w := &creditWaiter{ch: make(chan error, 1), n: n}
	if urgent {
		c.waiters = append([]*creditWaiter{w}, c.waiters...)
	} else {
		c.waiters = append(c.waiters, w)
	}
	c.mu.Unlock()
	select {
	case err := <-w.ch:
		return err
	case <-ctx.Done():
		c.mu.Lock()
		if w.done {
			// Handed its credits (or an error) while ctx ended: give them back.
			c.mu.Unlock()
			if err := <-w.ch; err == nil {
				c.ReleaseN(n)
			}
			return ctx.Err()
		}
		for i, x := range c.waiters {
			if x == w {
				c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		return ctx.Err()
	}
}

// TryCharge takes a credit if one is free and nobody is waiting.
func (c *Credits) TryCharge() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.used >= c.limit || len(c.waiters) > 0 {
		return false
	}
	c.used++
	return true
}

// handLocked gives free credits to waiters in order; a waiter asking for
// more than the account now holds fails (ErrTooFewCredits).
func (c *Credits) handLocked() {
	for len(c.waiters) > 0 {
		w := c.waiters[0]
		if w.n > 1 && w.n > c.limit {
			c.waiters[0] = nil
			c.waiters = c.waiters[1:]
			w.done = true
			w.ch <- ErrTooFewCredits
			continue
		}
		if c.used+w.n > c.limit {
			return
		}
		c.waiters[0] = nil
		c.waiters = c.waiters[1:]
		c.used += w.n
		w.done = true
		w.ch <- nil
	}
}

// Release returns a charged credit: its request completed.
func (c *Credits) Release() { c.ReleaseN(1) }

// ReleaseN returns n charged credits: a request that took them completed.
func (c *Credits) ReleaseN(n int) {
	c.mu.Lock()
	if c.used < n || n <= 0 {
		c.mu.Unlock()
		panic("protocol: Credits.Release without Charge")
	}
	c.used -= n
	c.handLocked()
	c.mu.Unlock()
}

// Retire gives up a charged credit for good: the server completed a credit
// message with LWIO_NOTIFY_CREDIT (FIG. 11C). A waiter now asking for more
// than the account holds fails with ErrTooFewCredits at once: no release
// may follow to fail it (the credits charged last can be the credit
// messages retiring them), and left queued it would hold up every charge
// behind it for good.
func (c *Credits) Retire() {
	c.mu.Lock()
	if c.used <= 0 || c.limit <= 0 {
		c.mu.Unlock()
		panic("protocol: Credits.Retire without Charge")
	}
	c.used--
	c.limit--
	c.handLocked()
	c.mu.Unlock()
}

// Loan adds n credits granted by a positive delta (FIG. 11A) and hands them
// to waiting requests.
func (c *Credits) Loan(n int) {
	if n < 0 {
		panic(fmt.Sprintf("protocol: Credits.Loan(%d)", n))
	}
	c.mu.Lock()
	c.limit += n
	c.handLocked()
	c.mu.Unlock()
}

// Limit is the number of credits held.
func (c *Credits) Limit() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limit
}

// Used is the number of credits charged and not yet released.
func (c *Credits) Used() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// Pending is the number of requests outstanding or waiting for a credit: the
// hint a client puts in every header's Credits field (FIG. 7A).
func (c *Credits) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used + len(c.waiters)
}

// Close fails every waiting and future Charge with err (the connection died).
func (c *Credits) Close(err error) {
	if err == nil {
		err = errors.New("lwio: credits closed")
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for _, w := range c.waiters {
		w.done = true
		w.ch <- c.err
	}
	c.waiters = nil
	c.mu.Unlock()
}

// creditTxn is the state of a connection's delta-credit transaction.
type creditTxn uint8

const (
	txnNone     creditTxn = iota // no transaction open
	txnGrant                     // +k sent, waiting for the one credit message
	txnRetire                    // −N sent, waiting for −N … −1
	txnRetiring                  // retire messages arriving
)

var creditTxnNames = [...]string{"none", "grant", "retire", "retiring"}

func (t creditTxn) String() string { return enum.Name(creditTxnNames[:], t, "creditTxn") }

// CreditGrant is the server's account of one connection: the credits granted,
// the requests outstanding against them, and the one delta-credit transaction
// that may be open. It is safe for concurrent use.
type CreditGrant struct {
	mu          sync.Mutex
	granted     int
	outstanding int
	txn         creditTxn
	delta       int // the open transaction's delta
	next        int // retire: the Offset value expected next (−N … −1)
	// capped: the client reported unused credits, so no positive delta
	// until a negative one (FIG. 11B).
	capped bool
}

// NewCreditGrant returns the account of a connection granted n credits at
// authentication (FIG. 6B Credits).
func NewCreditGrant(n int) *CreditGrant { return &CreditGrant{granted: n} }

// Receive counts a request that arrived. More requests outstanding than
// credits granted is a protocol violation.
func (g *CreditGrant) Receive() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.outstanding >= g.granted {
		return fmt.Errorf("%w: request beyond %d credits (%d outstanding)", ErrCreditViolation, g.granted, g.outstanding)
	}
	g.outstanding++
	return nil
}

// Complete counts a request completed (its response is about to be sent or
// its status block written). Call it before posting the completion, so that a
// client reusing the credit at once is not counted twice.
func (g *CreditGrant) Complete() {
	g.mu.Lock()
	if g.outstanding <= 0 {
		g.mu.Unlock()
		panic("protocol: CreditGrant.Complete without Receive")
	}
	g.outstanding--
	g.mu.Unlock()
}

// Granted and Outstanding report the account.
func (g *CreditGrant) Granted() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.granted
}

// Outstanding is the number of requests received and not yet completed.
func (g *CreditGrant) Outstanding() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.outstanding
}

// Open reports whether a delta-credit transaction is open.
func (g *CreditGrant) Open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.txn != txnNone
}

// StartGrant opens a positive transaction of k credits (FIG. 11A) and counts
// them granted at once: the server posts their receives before sending the
// delta. It returns false if a transaction is already open, or if the client
// last reported unused credits and no negative delta has happened since
// (FIG. 11B: "the server normally does not send another positive update
// message until at least one negative update is sent").
func (g *CreditGrant) StartGrant(k int) bool {
	if k <= 0 {
		panic(fmt.Sprintf("protocol: CreditGrant.StartGrant(%d)", k))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.txn != txnNone || g.capped {
		return false
	}
	g.txn, g.delta = txnGrant, k
	g.granted += k
	return true
}

// StartRetire opens a negative transaction asking the client to give up n
// credits (FIG. 11A with Information −n). It returns false if a transaction is
// open or n would leave the client without a credit.
func (g *CreditGrant) StartRetire(n int) bool {
	if n <= 0 {
		panic(fmt.Sprintf("protocol: CreditGrant.StartRetire(%d)", n))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.txn != txnNone || n >= g.granted {
		return false
	}
	g.txn, g.delta, g.next = txnRetire, -n, -n
	g.capped = false
	return true
}

// CreditMessage accounts an LWIO_OPCODE_CREDIT message (FIG. 11B), already
// counted by Receive, whose Offset carried v in its upper 32 bits. It returns
// the Status of the completing STATUS_RESPONSE (FIG. 11C): StatusSuccess for
// the answer to a positive delta (v ≥ 0 credits unused, taken back now), or
// NotifyCredit for each retiring message; with NotifyCredit the caller must
// call CompleteRetire instead of Complete. released is the number of credits
// the connection gave back by this message (for the server-wide budget). A
// message with no transaction open, or out of sequence, is a violation.
func (g *CreditGrant) CreditMessage(v int32) (st Status, released int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.txn == txnGrant && v >= 0:
		unused := int(v)
		if unused > g.delta {
			return 0, 0, fmt.Errorf("%w: %d credits unused of %d granted", ErrCreditViolation, unused, g.delta)
		}
		g.granted -= unused
		g.txn, g.delta = txnNone, 0
		g.capped = unused > 0
		return StatusSuccess, unused, nil
	case (g.txn == txnRetire || g.txn == txnRetiring) && v < 0:
		if int(v) != g.next {
			return 0, 0, fmt.Errorf("%w: credit message %d, want %d", ErrCreditViolation, v, g.next)
		}
		g.txn = txnRetiring
		g.next++
		if g.next == 0 {
			g.txn, g.delta = txnNone, 0
		}
		return NotifyCredit, 1, nil
	}
	return 0, 0, fmt.Errorf("%w: credit message %d with transaction %v", ErrCreditViolation, v, g.txn)
}

// CompleteRetire completes a retiring credit message: the request is no
// longer outstanding and its credit is gone.
func (g *CreditGrant) CompleteRetire() {
	g.mu.Lock()
	if g.outstanding <= 0 || g.granted <= 0 {
		g.mu.Unlock()
		panic("protocol: CreditGrant.CompleteRetire without Receive")
	}
	g.outstanding--
	g.granted--
	g.mu.Unlock()
}

// CreditPool is a server-wide credit budget shared by every connection, so
// that many clients cannot multiply server memory without bound. It is safe
// for concurrent use.
type CreditPool struct {
	mu    sync.Mutex
	total int
	used  int
	given chan struct{} // closed at the next Give (Given); nil: none asked
}

// NewCreditPool returns a budget of total credits.
func NewCreditPool(total int) *CreditPool { return &CreditPool{total: total} }

// Take takes up to n credits and returns how many it took (possibly 0).
func (p *CreditPool) Take(n int) int {
	if n <= 0 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if free := p.total - p.used; n > free {
		n = free
	}
	if n < 0 {
		n = 0
	}
	p.used += n
	return n
}

// Overdraw takes n credits whatever is left, overdrawing the budget, as
// long as no more than limit credits are then in use; it reports whether
// it took them. It is a new connection's minimal grant (the server then
// takes credits back from others).
func (p *CreditPool) Overdraw(n, limit int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used+n > limit {
		return false
	}
	p.used += n
	return true
}

// Given returns a channel closed when credits are next given back.
func (p *CreditPool) Given() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.given == nil {
		p.given = make(chan struct{})
	}
	return p.given
}

// Total is the budget.
func (p *CreditPool) Total() int { return p.total }

// Give returns n credits to the budget.
func (p *CreditPool) Give(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used -= n
	if p.used < 0 {
		panic("protocol: CreditPool.Give more than taken")
	}
	if p.given != nil && n > 0 {
		close(p.given)
		p.given = nil
	}
}

// Free is the number of credits left in the budget.
func (p *CreditPool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total - p.used
}

// Used is the number of credits taken from the budget.
func (p *CreditPool) Used() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}
