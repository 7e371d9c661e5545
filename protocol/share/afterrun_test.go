package share

import (
	"errors"
	"testing"
)

// TestAfterRunNested: a wait an operation leaves to afterRun runs once,
// off every identity thread, and before the outermost hand-off returns —
// also when the operation is another user's, handed over from inside a
// user's Run (two users' threads nested), when it runs in place, and when
// it panics.
func TestAfterRunNested(t *testing.T) {
	needPerUser(t)
	a, b := newCred(acctA), newCred(acctB)
	runsActive.Add(1) // as inside Tree.Run: a's own operations run in place
	defer runsActive.Add(-1)
	type ran struct{ onThread bool }
	for _, tc := range []struct {
		name  string
		inner *cred
	}{{"another user's operation", b}, {"the same user's, in place", a}} {
		waits := make(chan ran, 4)
		wait := func() { waits <- ran{onThread: !selfInPlace() || currentThread() != nil} }
		err := runAs(a, func() error {
			if err := runAs(tc.inner, func() error { afterRun(wait); return nil }); err != nil {
				return err
			}
			if len(waits) != 0 {
				return errors.New("the wait ran on a's identity thread, inside its operation")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if n := len(waits); n != 1 {
			t.Fatalf("%s: the wait ran %d times before the hand-off returned, want once", tc.name, n)
		}
		if r := <-waits; r.onThread {
			t.Errorf("%s: the wait ran on an identity thread", tc.name)
		}
	}

	// A panic after the wait was left: the wait still runs, then the
	// panic is raised again in the caller.
	waited := false
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic was not raised again")
			}
		}()
		runAs(b, func() error {
			afterRun(func() { waited = true })
			panic("boom")
		})
	}()
	if !waited {
		t.Error("a panicking operation's wait did not run")
	}
	// Off identity threads the wait runs at once.
	now := false
	afterRun(func() { now = true })
	if !now {
		t.Error("afterRun on a plain goroutine did not wait at once")
	}
}
