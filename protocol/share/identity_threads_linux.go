package share

import (
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Identity threads (see identity_linux.go for why an operation for a user
// runs on a thread that runs nothing else, ever): a pool of goroutines,
// each locked to its OS thread for life, that take one operation at a
// time. The pool grows with the operations in flight (a disk that does not
// answer holds one thread per stuck operation, as a plain goroutine
// would); at most maxIdleThreads wait for work, the others end after
// their operation, and the runtime ends their threads with them.
//
// An idle thread keeps the credentials of the account it served last;
// runAs prefers a thread already in c's credentials, so a user's steady
// stream of operations costs a hand-off between two threads and no
// credential change.

// maxIdleThreads bounds the identity threads kept waiting for work.
var maxIdleThreads = 4 + 2*runtime.GOMAXPROCS(0)

// identityThread is one locked thread. cur is the credentials it has now
// (nil: the server's own).
type identityThread struct {
	work chan identityJob
	cur  *cred
	// after is what the job in progress left for its caller to wait
	// for (afterRun).
	after []func()
}

// identityJob is one operation and where its result goes. A panic in fn
// is carried back and raised again on the caller's goroutine, where it
// would have happened before.
type identityJob struct {
	c    *cred
	fn   func() error
	done chan identityResult
}

type identityResult struct {
	err      error
	panicked bool
	value    any
	after    []func() // afterRun's waits, for the caller
}

var identityThreads struct {
	sync.Mutex
	idle  []*identityThread       // most recently idle last
	byTid map[int]*identityThread // every live one, by its thread id (afterRun)
}

// Waits after a run. An operation that must wait for something that is
// not a disk operation — a lease break's acknowledgement from another
// client, up to the break timeout — does not wait on its identity thread:
// the pool has no cap (a thread per operation in flight), and many changes
// waiting for a silent client would each hold an OS thread for seconds.
// It hands the wait to afterRun instead, which the goroutine that handed
// the operation over (runAs, after the thread's answer) runs before it
// returns: the operation still returns only after the wait, on a goroutine
// that is not locked to a thread. Which identity thread the caller is on
// is looked up by thread id, and only after the kernel said that the
// calling thread has a user's credentials: then it is an identity thread
// and the caller its own locked goroutine ("Nested runs" below), so the
// id cannot go stale. An operation with the server's credentials inside a Run
// (runAsServer: a goroutine of its own, which the identity thread waits
// for) still waits where it is: that goroutine is not an identity thread's.

// afterRun runs wait when the operation in progress returns to its caller:
// at once when the calling goroutine is not an identity thread's, else
// when the identity thread hands its result back (runAs).
func afterRun(wait func()) {
	if t := currentThread(); t != nil {
		t.after = append(t.after, wait)
		return
	}
	wait()
}

// currentThread is the identity thread the caller runs on in a user's
// credentials; nil on any other thread.
func currentThread() *identityThread {
	if !self.perUser || selfInPlace() {
		return nil
	}
	p := &identityThreads
	p.Lock()
	defer p.Unlock()
	return p.byTid[unix.Gettid()]
}

// LiveIdentityThreads is how many identity threads exist, busy or idle.
func LiveIdentityThreads() int {
	p := &identityThreads
	p.Lock()
	defer p.Unlock()
	return len(p.byTid)
}

var doneChans = sync.Pool{New: func() any { return make(chan identityResult, 1) }}

// Nested runs. A whole request may run on one identity thread (Tree.Run),
// and the tree operations it makes each call run again with the same
// credentials: those run in place, on the thread already in them, instead
// of being handed to another (the hand-off, two thread wake-ups, is what an
// operation costs most). Whether the caller's thread is in c's credentials
// is asked of the kernel — the calling thread's fsuid, fsgid and groups
// (inPlace) — never of a table by thread id: only an identity thread ever
// has other credentials than the server's, and a goroutine that finds
// itself on one is that thread's own, locked to it, so the answer holds
// for as long as fn runs. A goroutine that is not locked cannot hold such
// an answer: between asking which thread it is on and acting on it, it may
// move to another thread, and the thread it left may have been taken by a
// new identity goroutine (identity goroutines lock whichever thread they
// start on). That is what made the first Tree.Run (61fefb1, reverted)
// race: its gettid-keyed table could hand a goroutine of the LWIO engine
// the identity thread that had just taken its former thread, and run a
// user's write in place with the server's credentials.

// runsActive counts Tree.Run calls in progress: while it is 0 no goroutine
// is inside one, and no operation asks the kernel whether it may run in
// place.
var runsActive atomic.Int64

// handoffs counts operations handed to an identity thread (tests).
var handoffs atomic.Int64

// runAs runs fn on an identity thread in c's credentials and waits for it:
// in place when the caller is on such a thread already (inside Tree.Run).
func runAs(c *cred, fn func() error) error {
	if runsActive.Load() > 0 && c.inPlace() {
		return fn()
	}
	handoffs.Add(1)
	done := doneChans.Get().(chan identityResult)
	takeThread(c).work <- identityJob{c: c, fn: fn, done: done}
	r := <-done
	doneChans.Put(done)
	for _, w := range r.after {
		afterRun(w) // the caller may be an identity thread itself (another user's)
	}
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// runAsServer runs fn with the server's credentials for a caller on an
// identity thread: on a new goroutine (never on a locked thread, so on one
// with the server's credentials), waited for, its panic raised again here.
func runAsServer(fn func() error) error {
	done := doneChans.Get().(chan identityResult)
	go func() {
		r := identityResult{}
		defer func() {
			if v := recover(); v != nil {
				r = identityResult{panicked: true, value: v}
			}
			done <- r
		}()
		r.err = fn()
	}()
	r := <-done
	doneChans.Put(done)
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// takeThread is an idle identity thread, one already in c's credentials
// if there is one, else the most recently idle, else a new one.
func takeThread(c *cred) *identityThread {
	p := &identityThreads
	p.Lock()
	t, ok := takePreferred(&p.idle, func(t *identityThread) bool { return t.cur == c })
	p.Unlock()
	if ok {
		return t
	}
	t = &identityThread{work: make(chan identityJob, 1)}
	go t.loop()
	return t
}

// takePreferred removes and returns from idle (most recently idle last)
// the most recently idle element that is preferred, else the most
// recently idle one; false when idle is empty.
func takePreferred[T any](idle *[]T, preferred func(T) bool) (T, bool) {
	s := *idle
	n := len(s)
	if n == 0 {
		var zero T
		return zero, false
	}
	i := n - 1
	for j := n - 1; j >= 0; j-- {
		if preferred(s[j]) {
			i = j
			break
		}
	}
	e := s[i]
	*idle = append(s[:i], s[i+1:]...)
	return e, true
}

// giveBack puts t among the idle threads; false when enough are idle
// already and t should end.
func giveBack(t *identityThread) bool {
	p := &identityThreads
	p.Lock()
	defer p.Unlock()
	if len(p.idle) >= maxIdleThreads {
		return false
	}
	p.idle = append(p.idle, t)
	return true
}

// loop serves jobs on a thread locked for life: it returns (and the thread
// ends) when it is not needed among the idle threads or its credentials
// could not be changed back.
func (t *identityThread) loop() {
	runtime.LockOSThread() // never unlocked: see identity_linux.go
	tid := unix.Gettid()
	p := &identityThreads
	p.Lock()
	if p.byTid == nil {
		p.byTid = map[int]*identityThread{}
	}
	p.byTid[tid] = t
	p.Unlock()
	defer func() {
		p.Lock()
		delete(p.byTid, tid)
		p.Unlock()
	}()
	for j := range t.work {
		r, ok := t.serve(j)
		r.after, t.after = t.after, nil
		if !ok {
			restoreFailures.Add(1)
		}
		if ok && !giveBack(t) {
			ok = false
		}
		j.done <- r // after giveBack: the caller's next operation may find t idle
		if !ok {
			return
		}
	}
}

// serve switches the thread to j's credentials (from whatever it had) and
// runs j.fn. ok is false when the thread's credentials are no longer
// known: it must end.
func (t *identityThread) serve(j identityJob) (r identityResult, ok bool) {
	if t.cur != j.c {
		if t.cur != nil {
			if err := self.restore(t.cur); err != nil {
				return identityResult{err: err}, false
			}
			t.cur = nil
		}
		if err := j.c.enter(); err != nil {
			if rerr := self.restore(nil); rerr != nil {
				return identityResult{err: err}, false
			}
			return identityResult{err: err}, true
		}
		t.cur = j.c
	}
	defer func() {
		if v := recover(); v != nil {
			// fn panicked in the thread's credentials, which it did
			// not change: the thread stays usable.
			r, ok = identityResult{panicked: true, value: v}, true
		}
	}()
	return identityResult{err: j.fn()}, true
}
