package server

import "time"

// Request goroutines. An I/O request that does not run inline on the
// reaper runs on a request goroutine of the server's: an idle one takes it
// over a channel, else a new one starts and stays for the next. A go
// statement per request would allocate its closure every time; this
// hand-off allocates nothing once enough goroutines exist for the load,
// and wakes a parked goroutine just as a new one would be scheduled.

// workerIdle is how long an idle request goroutine waits for work before
// it exits, so a burst does not leave its goroutines behind for good.
const workerIdle = 10 * time.Second

// runIO runs sl's I/O request (execIO) on a request goroutine. c.reqs was
// added for it.
func (s *Server) runIO(sl *slot) {
	select {
	case s.runq <- sl:
	default:
		go s.requests(sl)
	}
}

// requests is a request goroutine: it runs sl, then whatever runIO hands
// it, until it has been idle for workerIdle or the server closes.
func (s *Server) requests(sl *slot) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		sl.c.execIO(sl, false)
		idle.Reset(workerIdle)
		select {
		case sl = <-s.runq:
		case <-idle.C:
			return
		case <-s.quit:
			return
		}
	}
}
