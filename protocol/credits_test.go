package protocol

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
)

func TestCreditsChargeRelease(t *testing.T) {
	c := NewCredits(2)
	ctx := context.Background()
	charge(t, c, 2)
	if c.TryCharge() {
		t.Fatal("TryCharge succeeded with every credit in use")
	}
	got := make(chan error, 1)
	go func() { got <- c.Charge(ctx) }()
	waitPending(t, c, 3)
	select {
	case err := <-got:
		t.Fatalf("third Charge returned %v with 2 credits in use", err)
	default:
	}
	c.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wantCredits(t, c, 2, 2)
}

func TestCreditsFIFOAndUrgent(t *testing.T) {
	c := NewCredits(1)
	ctx := context.Background()
	charge(t, c, 1)
	order := make(chan string, 3)
	var wg sync.WaitGroup
	start := func(name string, urgent bool, n int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if urgent {
				err = c.ChargeUrgent(ctx)
			} else {
				err = c.Charge(ctx)
			}
			if err != nil {
				t.Error(err)
				return
			}
			order <- name
			c.Release()
		}()
		waitPending(t, c, n)
	}
	start("a", false, 2)
	start("b", false, 3)
	start("urgent", true, 4)
	c.Release()
	wg.Wait()
	close(order)
	var got []string
	for s := range order {
		got = append(got, s)
	}
	want := []string{"urgent", "a", "b"}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestCreditsLoanWakesWaiters(t *testing.T) {
	c := NewCredits(0)
	got := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { got <- c.Charge(context.Background()) }()
	}
	waitPending(t, c, 2)
	c.Loan(2)
	for i := 0; i < 2; i++ {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	wantCredits(t, c, 2, 2)
}

func TestCreditsRetire(t *testing.T) {
	c := NewCredits(3)
	charge(t, c, 3)
	c.Retire()
	c.Release()
	wantCredits(t, c, 1, 2)
	if !c.TryCharge() || c.TryCharge() {
		t.Fatal("after retiring one of 3 credits, exactly one more charge should fit")
	}
}

func TestCreditsContextAndClose(t *testing.T) {
	c := NewCredits(0)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- c.Charge(ctx) }()
	waitPending(t, c, 1)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("Charge after cancel: %v", err)
	}
	if c.Pending() != 0 {
		t.Fatalf("cancelled waiter still pending (%d)", c.Pending())
	}
	dead := errors.New("connection died")
	go func() { got <- c.Charge(context.Background()) }()
	waitPending(t, c, 1)
	c.Close(dead)
	if err := <-got; !errors.Is(err, dead) {
		t.Fatalf("Charge after Close: %v", err)
	}
	if err := c.Charge(context.Background()); !errors.Is(err, dead) {
		t.Fatalf("Charge on closed account: %v", err)
	}
}

// A waiter whose context ends just as it is handed a credit must not leak it.
func TestCreditsCancelRaceKeepsBalance(t *testing.T) {
	c := NewCredits(1)
	for i := 0; i < 200; i++ {
		if err := c.Charge(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() { got <- c.Charge(ctx) }()
		waitPending(t, c, 2)
		go cancel()
		c.Release()
		if err := <-got; err == nil {
			c.Release()
		}
		cancel()
		if c.Used() != 0 {
			t.Fatalf("iteration %d: %d credits leaked", i, c.Used())
		}
	}
}

func TestCreditGrantViolation(t *testing.T) {
	g := NewCreditGrant(2)
	if err := g.Receive(); err != nil {
		t.Fatal(err)
	}
	if err := g.Receive(); err != nil {
		t.Fatal(err)
	}
	if err := g.Receive(); !errors.Is(err, ErrCreditViolation) {
		t.Fatalf("third request on 2 credits: %v, want violation", err)
	}
	g.Complete()
	if err := g.Receive(); err != nil {
		t.Fatalf("request after a completion: %v", err)
	}
}

// FIG. 10/11: +k, the client reports u unused; the grant shrinks by u.
func TestCreditGrantPositive(t *testing.T) {
	g := NewCreditGrant(4)
	if !g.StartGrant(4) {
		t.Fatal("StartGrant refused with no transaction open")
	}
	if g.StartGrant(1) || g.StartRetire(1) {
		t.Fatal("second transaction started while one is open")
	}
	if g.Granted() != 8 {
		t.Fatalf("granted %d, want 8", g.Granted())
	}
	creditsMust(t, g.Receive())
	st, released, err := g.CreditMessage(3)
	if err != nil || st != StatusSuccess || released != 3 {
		t.Fatalf("CreditMessage(3) = %v %d %v", st, released, err)
	}
	g.Complete()
	if g.Granted() != 5 || g.Open() {
		t.Fatalf("granted %d open %v, want 5 false", g.Granted(), g.Open())
	}
	if _, _, err := g.CreditMessage(0); !errors.Is(err, ErrCreditViolation) {
		t.Fatalf("credit message with no transaction: %v", err)
	}
	if g.StartGrant(1) {
		t.Fatal("positive delta after the client reported unused credits")
	}
	if !g.StartRetire(1) {
		t.Fatal("negative delta refused")
	}
	creditsMust(t, g.Receive())
	g.CreditMessage(-1)
	g.CompleteRetire()
	if !g.StartGrant(1) {
		t.Fatal("positive delta refused after a negative one")
	}
}

// FIG. 11B: −N is answered by N messages −N … −1, each retiring one credit.
func TestCreditGrantRetire(t *testing.T) {
	g := NewCreditGrant(5)
	if g.StartRetire(5) {
		t.Fatal("retiring every credit must be refused")
	}
	if !g.StartRetire(3) {
		t.Fatal("StartRetire(3) refused")
	}
	for v := int32(-3); v <= -1; v++ {
		creditsMust(t, g.Receive())
		st, released, err := g.CreditMessage(v)
		if err != nil || st != NotifyCredit || released != 1 {
			t.Fatalf("CreditMessage(%d) = %v %d %v", v, st, released, err)
		}
		g.CompleteRetire()
		if v != -1 && !g.Open() {
			t.Fatalf("transaction closed after %d", v)
		}
	}
	if g.Open() || g.Granted() != 2 || g.Outstanding() != 0 {
		t.Fatalf("open %v granted %d outstanding %d", g.Open(), g.Granted(), g.Outstanding())
	}
	if !g.StartGrant(1) {
		t.Fatal("new transaction refused after -1")
	}
}

func TestCreditGrantRetireOutOfOrder(t *testing.T) {
	g := NewCreditGrant(5)
	g.StartRetire(2)
	creditsMust(t, g.Receive())
	if _, _, err := g.CreditMessage(-1); !errors.Is(err, ErrCreditViolation) {
		t.Fatalf("-1 before -2: %v", err)
	}
	g2 := NewCreditGrant(5)
	g2.StartGrant(2)
	if _, _, err := g2.CreditMessage(3); !errors.Is(err, ErrCreditViolation) {
		t.Fatalf("3 unused of 2 granted: %v", err)
	}
	g3 := NewCreditGrant(5)
	g3.StartGrant(2)
	if _, _, err := g3.CreditMessage(-1); !errors.Is(err, ErrCreditViolation) {
		t.Fatalf("negative answer to a positive delta: %v", err)
	}
}

func TestCreditPool(t *testing.T) {
	p := NewCreditPool(10)
	if got := p.Take(6); got != 6 {
		t.Fatalf("Take(6) = %d", got)
	}
	if got := p.Take(6); got != 4 {
		t.Fatalf("Take(6) on 4 free = %d", got)
	}
	if got := p.Take(1); got != 0 || p.Free() != 0 {
		t.Fatalf("Take on empty pool = %d, free %d", got, p.Free())
	}
	p.Give(5)
	if p.Free() != 5 || p.Used() != 5 {
		t.Fatalf("free %d used %d", p.Free(), p.Used())
	}
}

func creditsMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// waitPending waits until n requests are outstanding or waiting on c
// (Pending): the Charges started before it are in c's queue.
// charge charges n credits one at a time, failing the test on an error.
func charge(t *testing.T, c *Credits, n int) {
	t.Helper()
	for range n {
		if err := c.Charge(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// wantCredits fails the test unless c has used credits charged of limit
// held.
func wantCredits(t *testing.T, c *Credits, used, limit int) {
	t.Helper()
	if c.Used() != used || c.Limit() != limit {
		t.Fatalf("used %d limit %d, want %d %d", c.Used(), c.Limit(), used, limit)
	}
}

func waitPending(t *testing.T, c *Credits, n int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d credits pending", n), 5*time.Second, func() bool { return c.Pending() == n })
}

// ChargeN takes its credits all at once, in FIFO order with single
// charges, and fails rather than wait for more than the account holds.
func TestCreditsChargeN(t *testing.T) {
	c := NewCredits(4)
	ctx := context.Background()
	if err := c.ChargeN(ctx, 5); !errors.Is(err, ErrTooFewCredits) {
		t.Fatalf("ChargeN(5) of 4 credits: %v", err)
	}
	if err := c.ChargeN(ctx, 3); err != nil || c.Used() != 3 {
		t.Fatalf("ChargeN(3): %v, used %d", err, c.Used())
	}
	got := make(chan string, 2)
	go func() {
		if err := c.ChargeN(ctx, 3); err == nil {
			got <- "three"
		}
	}()
	waitPending(t, c, 4) // 3 used + 1 waiter
	go func() {
		if err := c.Charge(ctx); err == nil {
			got <- "one"
		}
	}()
	waitPending(t, c, 5)
	// One credit is free, but the 3-credit waiter is first: nobody goes.
	select {
	case s := <-got:
		t.Fatalf("%s charged out of order", s)
	case <-time.After(20 * time.Millisecond):
	}
	c.ReleaseN(3) // both fit now: three, then one
	if a, b := <-got, <-got; a+b != "threeone" && a+b != "onethree" || c.Used() != 4 {
		t.Fatalf("got %s, %s with %d used; want both, 4 used", a, b, c.Used())
	}
	// A waiter for more than is left after a retirement fails.
	c2 := NewCredits(3)
	c2.ChargeN(ctx, 3)
	failed := make(chan error, 1)
	go func() { failed <- c2.ChargeN(ctx, 3) }()
	waitPending(t, c2, 4)
	c2.Retire()
	c2.ReleaseN(2)
	if err := <-failed; !errors.Is(err, ErrTooFewCredits) {
		t.Fatalf("waiter for 3 of 2 credits: %v", err)
	}
}

// A retirement that leaves fewer credits than a waiter asks for fails it
// at once, even when no release follows: the last credits charged may be
// the credit messages that retire them (the client's answer to a negative
// delta), and a waiter left queued then blocks every charge behind it for
// good (the make bench hang of 40f0bd7).
func TestCreditsRetireFailsWaiterAtOnce(t *testing.T) {
	c := NewCredits(8)
	ctx := context.Background()
	if err := c.ChargeN(ctx, 8); err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() { waiter <- c.ChargeN(ctx, 8) }()
	waitPending(t, c, 9)
	behind := make(chan error, 1)
	go func() { behind <- c.Charge(ctx) }()
	waitPending(t, c, 10)
	// The credit message retiring one credit is charged ahead of the
	// waiters when the write completes, and completes with NOTIFY_CREDIT.
	urgent := make(chan error, 1)
	go func() { urgent <- c.ChargeUrgent(ctx) }()
	waitPending(t, c, 11)
	c.ReleaseN(8)
	if err := <-urgent; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiter:
		t.Fatalf("waiter for 8 credits ended before the retirement: %v", err)
	default:
	}
	c.Retire()
	// 7 credits are left: the 8-credit waiter can never be served, the
	// one behind it must be.
	if err := <-waiter; !errors.Is(err, ErrTooFewCredits) {
		t.Fatalf("waiter for 8 of 7 credits: %v, want ErrTooFewCredits", err)
	}
	if err := <-behind; err != nil {
		t.Fatalf("single charge behind it: %v", err)
	}
	wantCredits(t, c, 1, 7)
}
