package session

import (
	"strings"
	"sync"
	"time"

	"github.com/lwiofs/lwiofs/internal/defaults"
)

// Logon throttling. Every failed logon makes the next attempts for the
// same user from the same source address wait, and — more gently — every
// attempt from that address whatever the user: 2^(n-1) times the base
// delay after n failures, capped. A logon is verified only when its turn
// comes: attempts for one key are spaced by the delay, whether they come
// on one connection or on many at once, so opening more connections
// gains an attacker nothing. For a (user, address), an attempt still
// being verified counts as a failure until it is known, so a burst of
// parallel first guesses is spaced too; for an address alone only real
// failures count, so that the many users of one address (a NAT) logging
// on at once wait for nothing. The user's correct logon from another
// address is not held back, since no key it uses has failures. A success
// clears its (user, address) key; failures are forgotten after
// throttleForget without one. Waiting costs no thread: the connection's
// goroutine sleeps on a timer (and wakes at once when the server closes).

// Defaults of the throttle.
const (
	DefaultLogonDelay    = 200 * time.Millisecond // after the first failure of a (user, address)
	DefaultLogonDelayMax = 30 * time.Second       // the most one attempt waits per key
	// the per-address key grows from a quarter of the base delay and is
	// capped at a third of the maximum: many users may share an address
	// (a NAT), and one user's typos should cost the others little.
	addrDelayDivisor = 4
	addrCapDivisor   = 3
	throttleForget   = 15 * time.Minute
	throttleMaxKeys  = 1 << 16
)

// throttle is the failure table. Safe for concurrent use.
type throttle struct {
	base, max time.Duration
	now       func() time.Time

	mu   sync.Mutex
	keys map[throttleKey]*penalty
}

// throttleKey is a (user, address) pair, or an address alone (user "").
type throttleKey struct{ user, addr string }

type penalty struct {
	failures int
	inflight int       // admitted and not yet known (the (user, address) key only)
	next     time.Time // an attempt is verified no earlier than this
	last     time.Time // the last failure, or admission
}

func newThrottle(base, max time.Duration) *throttle {
	defaults.Set(&base, DefaultLogonDelay)
	defaults.Set(&max, DefaultLogonDelayMax)
	return &throttle{base: base, max: max, now: time.Now, keys: map[throttleKey]*penalty{}}
}

// delay is how far apart attempts under key must be after n failures.
func (t *throttle) delay(k throttleKey, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	base, max := t.base, t.max
	if k.user == "" {
		base, max = base/addrDelayDivisor, max/addrCapDivisor
	}
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

func (t *throttle) keysOf(user, addr string) [2]throttleKey {
	return [2]throttleKey{{strings.ToLower(user), addr}, {"", addr}}
}

// admit reserves the turn of an attempt by user from addr and returns how
// long it must wait for it: zero unless one of its keys has failures (or,
// for the user's, attempts still in flight). Every admit is followed by
// failed, succeeded or abandoned.
func (t *throttle) admit(user, addr string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := t.keysOf(user, addr)
	var wait time.Duration
	for i, k := range keys {
		p := t.live(k, now)
		if i == 0 && p == nil {
			if len(t.keys) >= throttleMaxKeys {
				t.sweep(now)
			}
			p = &penalty{}
			t.keys[k] = p
		}
		if p == nil {
			continue
		}
		n := p.failures
		if i == 0 {
			n += p.inflight
			p.inflight++
			p.last = now
		}
		if n == 0 && i == 0 {
			p.next = now.Add(t.delay(k, p.inflight))
			continue
		}
		at := p.next
		if at.Before(now) {
			at = now
		}
		p.next = at.Add(t.delay(k, n+boolInt(i == 0)))
		wait = max(wait, at.Sub(now))
	}
	return wait
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// abandoned forgets an admitted attempt whose outcome will never be known
// (the server closed while it waited).
func (t *throttle) abandoned(user, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.keysOf(user, addr)[0]
	if p := t.keys[k]; p != nil {
		if p.inflight > 0 {
			p.inflight--
		}
		if p.inflight == 0 && p.failures == 0 {
			delete(t.keys, k)
		}
	}
}

// live returns key's entry unless it has none or its failures are old
// enough to forget.
func (t *throttle) live(k throttleKey, now time.Time) *penalty {
	p := t.keys[k]
	if p != nil && now.Sub(p.last) > throttleForget {
		delete(t.keys, k)
		return nil
	}
	return p
}

// failed records a failed attempt and returns the failures now counted
// for (user, addr) and for addr.
func (t *throttle) failed(user, addr string) (userFailures, addrFailures int) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.keys) >= throttleMaxKeys {
		t.sweep(now)
	}
	var n [2]int
	for i, k := range t.keysOf(user, addr) {
		p := t.live(k, now)
		if p == nil {
			p = &penalty{}
			t.keys[k] = p
		}
		if i == 0 && p.inflight > 0 {
			p.inflight--
		}
		p.failures++
		p.last = now
		if next := now.Add(t.delay(k, p.failures)); next.After(p.next) {
			p.next = next
		}
		n[i] = p.failures
	}
	return n[0], n[1]
}

// succeeded clears the (user, addr) key: the user knows the password.
// The address's own count is left to time, so that an attacker who owns
// one account cannot clear the penalty of its guesses at the others.
func (t *throttle) succeeded(user, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.keys, t.keysOf(user, addr)[0])
}

// sweep forgets every entry old enough, and if the table is still full
// the oldest half: memory stays bounded under a spray of user names.
func (t *throttle) sweep(now time.Time) {
	for k, p := range t.keys {
		if now.Sub(p.last) > throttleForget {
			delete(t.keys, k)
		}
	}
	if len(t.keys) < throttleMaxKeys {
		return
	}
	cut := now.Add(-throttleForget / 2)
	for k, p := range t.keys {
		if p.last.Before(cut) || len(t.keys) >= throttleMaxKeys {
			delete(t.keys, k)
		}
	}
}
