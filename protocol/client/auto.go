package client

import "sync/atomic"

// Auto completion (Config.Completion = Auto) follows the seed's intent for
// the two modes of FIG. 8: interrupts for an idle connection, polling for a
// busy one. Measured on softrdma before Auto existed: at queue depth 1
// polling needed an INTERRUPT request for 93–96% of its I/Os (nothing else
// completes while the one request waits, so every wait outlasts the spin)
// and ran at half the interrupt mode's rate; at depth 16, 18–22%.
//
// Only small I/O requests (at most autoPollMax, 64 KiB) are candidates for
// polling: a larger one's transfer takes far longer than an interrupt-mode
// wakeup (1 MiB over softrdma: about a millisecond, against tens of
// microseconds), so polling it saves nothing, and its sleeping or spinning
// waiter only competes for the CPU that moves the data. Through the mount
// on two cores, with two connections, Auto polled the 1 MiB O_DIRECT jobs
// at depth 16 and fell to 0.66–0.92× the better fixed mode on writes. A
// large request completes in interrupt mode and, being one, is a doorbell
// for small polling requests beside it.
//
// A connection's load is a moving average of the requests pending on it,
// sampled as each small I/O request is prepared (the last eight or so
// weigh most; a large request is no sample, so a connection carrying only
// large ones stays idle). It is busy once the load reaches autoBusy and
// idle again at autoIdle or below: hysteresis and the average keep a
// steady load from flapping (through a FUSE mount at queue depth 16 on two
// connections, the instantaneous count hovers around 2–5 per connection).
// An idle connection's requests use interrupt mode. A busy connection's
// small requests poll, except that it keeps autoDoorbells (two)
// interrupt-mode I/Os in flight: their completions are CQ events, the
// connection's doorbells. A polling request that has to sleep while a
// doorbell is in flight sends no INTERRUPT: the dispatch of every CQ batch
// looks at the sleeping requests' status blocks and wakes those that have
// come (pollSleepers), and the last doorbell to complete wakes them all so
// that they can re-arm (a new doorbell, or an INTERRUPT when the load has
// gone). So under a steady load INTERRUPT requests are rare, and at depth 1
// there are none.
//
// Why two: a status block written by the server is no CQ event, so a
// polling request whose spin missed it (on two shared cores nearly every
// spin misses) waits for the next batch, and with one doorbell among the
// 4–7 requests a connection holds through the mount that batch can be most
// of a window later. Through the mount (4 KiB random reads at depth 16,
// softrdma, two cores, interleaved, load 8–10) interrupt mode beat polling
// in every run, and one doorbell left Auto at 0.63–0.87× the interrupt
// mode; two doorbells: 0.90–0.93×, half the INTERRUPT requests (2.3 % of
// the I/Os rather than 4.4 %) and fewer switches. In process at depth 16
// about 60 % of the I/Os still poll (82 % with one doorbell); a third
// doorbell brought that under half.
const (
	loadOne  = 16 // fixed point: one pending request
	autoBusy = 3 * loadOne
	autoIdle = 3 * loadOne / 2
	// autoPollMax is the largest I/O request Auto lets poll; larger ones
	// complete in interrupt mode and are not load samples.
	autoPollMax = 64 << 10
	// autoDoorbells is how many interrupt-mode I/O requests a busy
	// connection keeps in flight beside its polling ones.
	autoDoorbells = 2
)

// autoState is a connection's Auto decision.
type autoState struct {
	load     atomic.Int32 // moving average of pending requests × loadOne
	busy     atomic.Bool
	switches atomic.Uint64
	// doorbells are interrupt-mode I/O requests in flight; sleepers are
	// polling requests waiting for a wakeup.
	doorbells atomic.Int32
	sleepers  atomic.Int32
}

// polls decides whether an I/O request of mode m moving n bytes of file
// data polls (FIG. 8: the mode is chosen per request).
func (c *conn) polls(m Mode, n int) bool {
	switch m {
	case Polling:
		return true
	case Auto:
		if n > autoPollMax {
			return false
		}
		a := &c.auto
		// A racy read-modify-write: a lost sample only nudges the average.
		l := a.load.Load()
		l += (int32(c.credits.Pending())*loadOne - l) / 8
		a.load.Store(l)
		switch busy := a.busy.Load(); {
		case !busy && l >= autoBusy:
			if a.busy.CompareAndSwap(false, true) {
				a.switches.Add(1)
			}
		case busy && l <= autoIdle:
			if a.busy.CompareAndSwap(true, false) {
				a.switches.Add(1)
			}
		}
		return a.busy.Load() && a.doorbells.Load() >= autoDoorbells
	}
	return false
}

// rang is called when an interrupt-mode I/O request completes: with the
// last doorbell gone, every sleeping polling request is woken to re-arm.
func (c *conn) rang() {
	if c.auto.doorbells.Add(-1) == 0 && c.auto.sleepers.Load() > 0 {
		c.pollSleepers(true)
	}
}

// pollSleepers wakes the requests waiting in waitPoll whose status block has
// come, or all of them: called by the reaper role after each batch of
// completions while some sleep. A poke to a request that is not polling,
// or to a later request in the same slot, only makes it look once more.
func (c *conn) pollSleepers(all bool) {
	n := min(int(c.nslots.Load()), maxSlots)
	for i := 0; i < n; i++ {
		sl := c.slots[i].Load()
		if sl == nil || sl.state.Load() != slotWaiting {
			continue
		}
		if _, done := pollIOS(sl.remote.Bytes()); done || all {
			signal(sl.poke)
		}
	}
}
