package session

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newFakeThrottle() (*throttle, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	th := newThrottle(100*time.Millisecond, 3200*time.Millisecond)
	th.now = clk.now
	return th, clk
}

// TestThrottleDelays: the delays grow per failure and are capped, per
// (user, address) and, more gently, per address; another address is not
// held back; parallel attempts are spaced, not released together; a
// success clears the user's key; old failures are forgotten.
func TestThrottleDelays(t *testing.T) {
	th, clk := newFakeThrottle()
	if w := th.admit("alice", "A"); w != 0 {
		t.Fatalf("first attempt waits %v", w)
	}
	// Right after the n-th failure the next attempt waits 100 ms·2^(n-1),
	// at most 3.2 s.
	for n, want := range []time.Duration{100, 200, 400, 800, 1600, 3200, 3200} {
		th.failed("alice", "A")
		if w := th.admit("alice", "A"); w != want*time.Millisecond {
			t.Errorf("after %d failures: wait %v, want %v", n+1, w, want*time.Millisecond)
		}
		clk.add(time.Minute) // past every reserved turn
	}

	th, clk = newFakeThrottle()
	for range 3 {
		th.failed("alice", "A")
	}
	// The address's own key: 100/4 ms·2^2 after three failures.
	if w := th.admit("bob", "A"); w != 100*time.Millisecond {
		t.Errorf("bob from the attacked address waits %v, want 100ms (the address's key)", w)
	}
	if w := th.admit("alice", "B"); w != 0 {
		t.Errorf("alice from another address waits %v", w)
	}
	// Three attempts at once get one turn each, and each one not yet
	// answered counts as a failure for the next: 0.4 s, then 0.8 and 1.6
	// s further.
	w1, w2, w3 := th.admit("alice", "A"), th.admit("alice", "A"), th.admit("alice", "A")
	if !(w1 == 400*time.Millisecond && w2 == 1200*time.Millisecond && w3 == 2800*time.Millisecond) {
		t.Errorf("three parallel attempts wait %v %v %v, want 400ms 1.2s 2.8s", w1, w2, w3)
	}
	for range 3 {
		th.failed("alice", "A")
	}
	th.succeeded("alice", "A")
	clk.add(2 * time.Second)
	if w := th.admit("alice", "A"); w != 0 {
		t.Errorf("after a success, once the address's turn came: wait %v", w)
	}
	th.failed("carol", "C")
	clk.add(throttleForget + time.Second)
	if w := th.admit("carol", "C"); w != 0 {
		t.Errorf("an old failure still counts: wait %v", w)
	}
}

// TestThrottleBurst: parallel first guesses, before any has failed, are
// spaced too; the many users of one address logging on at once are not.
func TestThrottleBurst(t *testing.T) {
	th, _ := newFakeThrottle()
	var waits []time.Duration
	for range 4 {
		waits = append(waits, th.admit("alice", "A"))
	}
	want := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 700 * time.Millisecond}
	for i := range want {
		if waits[i] != want[i] {
			t.Errorf("parallel first guesses wait %v, want %v", waits, want)
			break
		}
	}
	for i := range 4 {
		if w := th.admit(fmt.Sprintf("user%d", i), "NAT"); w != 0 {
			t.Errorf("user%d logging on beside others from one address waits %v", i, w)
		}
	}
	th.succeeded("alice", "A")
	th.abandoned("alice", "A") // a logon the server gave up: nothing left
	if w := th.admit("bob", "B"); w != 0 {
		t.Errorf("an unrelated first logon waits %v", w)
	}
}

// TestThrottleCaps: the per-address key is capped at a third of the
// (user, address) cap.
func TestThrottleCaps(t *testing.T) {
	th, _ := newFakeThrottle()
	k := throttleKey{"", "A"}
	if d := th.delay(k, 50); d != 3200*time.Millisecond/addrCapDivisor {
		t.Errorf("address cap %v", d)
	}
	if d := th.delay(throttleKey{"u", "A"}, 50); d != 3200*time.Millisecond {
		t.Errorf("(user, address) cap %v", d)
	}
}

// dialFromAs logs on as user from the loopback address src.
func dialFromAs(ctx context.Context, src, addr, user, password string) (*Client, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := newClient(nc, ClientConfig{User: user, Password: password, Domain: "WORK"})
	if err := c.setup(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// TestLogonThrottle: an attacker guessing alice's password from one
// address is slowed, one logged line per failure naming user, domain and
// address; alice's correct logon from another address, started after
// the attacker's next guess, is answered before it.
func TestLogonThrottle(t *testing.T) {
	e := newEnv(t, func(c *ServerConfig) { c.LogonDelay = 300 * time.Millisecond; c.LogonDelayMax = time.Minute })
	ctx := ctxT(t)
	const attacker, home = "127.0.0.21", "127.0.0.22"
	const guesses = 4
	for range guesses {
		if _, err := dialFromAs(ctx, attacker, e.addr, testUser, "guess"); !errors.Is(err, ErrLogonFailure) {
			t.Fatalf("a wrong guess: %v", err)
		}
	}
	// The attacker's fifth guess waits its turn (300 ms · 2^3 after the
	// fourth failure, whatever the machine's speed); alice's logon from
	// home, started after it, has no failures to wait for.
	type result struct {
		who string
		err error
	}
	order := make(chan result, 2)
	go func() {
		_, err := dialFromAs(ctx, attacker, e.addr, testUser, "guess")
		order <- result{"attacker", err}
	}()
	time.Sleep(50 * time.Millisecond) // the attacker's guess goes first
	go func() {
		c, err := dialFromAs(ctx, home, e.addr, testUser, testPassword)
		if err == nil {
			c.Close()
		}
		order <- result{"alice", err}
	}()
	first, second := <-order, <-order
	if first.who != "alice" || first.err != nil {
		t.Errorf("first answer: %s (%v), want alice's successful logon before the attacker's guess", first.who, first.err)
	}
	if second.who != "attacker" || !errors.Is(second.err, ErrLogonFailure) {
		t.Errorf("second answer: %s (%v), want the attacker's failure", second.who, second.err)
	}
	// One line per failure, each with the user, the domain and the
	// attacker's address (not its port).
	var lines int
	for _, en := range e.hook.AllEntries() {
		if en.Message != "logon failure" {
			continue
		}
		lines++
		if en.Level != logrus.WarnLevel || en.Data["addr"] != attacker || en.Data["user"] != testUser || en.Data["domain"] != "WORK" {
			t.Errorf("logon failure line: level %v fields %v", en.Level, en.Data)
		}
	}
	if lines != guesses+1 {
		t.Errorf("%d logon failure lines, want %d (one per failure)", lines, guesses+1)
	}
	if strings.Contains(e.hook.LastEntry().Message, "panic") {
		t.Error(e.hook.LastEntry().Message)
	}
}
