package fs

import (
	"sync"
	"time"
)

// watchList starts the FUSE-interrupt watch (fileHandle.run) of the
// mount's data requests that have run for interruptWatch, with one timer
// for the whole mount instead of one per request. Arming a Go timer that
// is due before every other one wakes the runtime's poller thread
// (runtime.wakeNetPoller): a thread wake-up per 4 KiB read, on a machine
// whose two CPUs run fio, the mount and the server (issue 16: about one
// in three 4 KiB reads and writes paid it). Here the timer is armed by the
// first request after an idle spell and re-armed by its own tick while
// requests are in flight, so at most one wake-up per interruptWatch.
//
// A request is due once a whole tick period has passed over it: it
// registers in cur; a tick moves cur to old and starts the watch of what
// was in old. So the watch starts between interruptWatch and twice that
// after the request began; an interrupted request still gets at least
// interruptGrace from the INTERRUPT. The zero value is ready to use.
type watchList struct {
	mu    sync.Mutex
	timer *time.Timer // nil until first armed
	armed bool
	cur   map[*watchReq]struct{} // registered since the last tick
	old   map[*watchReq]struct{} // registered before it: due at the next
}

// watchReq is one request in flight; watch starts its interrupt watch.
type watchReq struct {
	watch func()
}

// add registers r; its watch starts if it is still registered after a
// whole tick period.
func (w *watchList) add(r *watchReq) {
	w.mu.Lock()
	if w.cur == nil {
		w.cur, w.old = map[*watchReq]struct{}{}, map[*watchReq]struct{}{}
	}
	w.cur[r] = struct{}{}
	if !w.armed {
		w.armed = true
		if w.timer == nil {
			w.timer = time.AfterFunc(interruptWatch, w.tick)
		} else {
			w.timer.Reset(interruptWatch)
		}
	}
	w.mu.Unlock()
}

// remove forgets r: the request is over.
func (w *watchList) remove(r *watchReq) {
	w.mu.Lock()
	delete(w.cur, r)
	delete(w.old, r)
	w.mu.Unlock()
}

// tick starts the watches that are due and re-arms the timer while
// requests are registered.
func (w *watchList) tick() {
	w.mu.Lock()
	var due []*watchReq // at most one tick per interruptWatch: not worth keeping
	for r := range w.old {
		due = append(due, r)
	}
	clear(w.old)
	w.cur, w.old = w.old, w.cur
	if len(w.old) > 0 {
		w.timer.Reset(interruptWatch)
	} else {
		w.armed = false
	}
	w.mu.Unlock()
	for _, r := range due {
		r.watch()
	}
}

// pending reports how many requests are registered and whether the timer
// is armed (for tests).
func (w *watchList) pending() (n int, armed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.cur) + len(w.old), w.armed
}
