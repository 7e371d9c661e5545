package client

import (
	"context"
	mrand "math/rand"
	"sync"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server"
)

// readLoad runs n 4 KiB random reads of f at queue depth qd.
func readLoad(t *testing.T, f *File, n, qd int, size int64) { readLoadBS(t, f, n, qd, size, 4096) }

// readLoadBS runs n random reads of bs bytes, bs-aligned, at queue depth qd.
func readLoadBS(t *testing.T, f *File, n, qd int, size int64, bs int) {
	t.Helper()
	spread(t, n, qd, func(rng *mrand.Rand, _ int) error {
		_, err := f.ReadAt(context.Background(), make([]byte, bs), rng.Int63n(size/int64(bs))*int64(bs))
		return err
	})
}

// autoFile is an Auto-mode client and a registered file of size random
// bytes.
func autoFile(t *testing.T, size int) (*Client, *File) {
	t.Helper()
	e := newEnv(t, server.Config{})
	s, cl := e.newClient(t, Auto)
	return cl, s.newFile(t, cl, "f", testutil.RandBytes(size))
}

// sumConns adds up the connections' completions by mode.
func sumConns(cl *Client) (polled, interrupted, switches uint64) {
	for _, ci := range cl.Conns() {
		polled += ci.Polled
		interrupted += ci.Interrupted
		switches += ci.Switches
	}
	return
}

// TestAutoSwitches: in Auto mode a connection idles in interrupt mode (an
// I/O at a time: no polling, no INTERRUPT request), polls under a steady
// queue depth 16 with INTERRUPT requests for at most 10% of the I/Os, and
// goes back to interrupts when the load goes; the mode is in Conns.
func TestAutoSwitches(t *testing.T) {
	const size = 8 << 20
	cl, f := autoFile(t, size)

	readLoad(t, f, 300, 1, size)
	polled, interrupted, _ := sumConns(cl)
	if polled != 0 || interrupted < 300 || cl.Stats().Interrupts != 0 {
		t.Fatalf("queue depth 1: %d polled, %d interrupt-mode, %d INTERRUPTs; want all interrupt mode and no INTERRUPT", polled, interrupted, cl.Stats().Interrupts)
	}
	for _, ci := range cl.Conns() {
		if ci.Completion != "auto/interrupt" {
			t.Fatalf("idle connection in %q", ci.Completion)
		}
	}

	const n = 6000
	readLoad(t, f, n, 16, size)
	p2, i2, switches := sumConns(cl)
	p2, i2 = p2-polled, i2-interrupted
	intr := cl.Stats().Interrupts
	t.Logf("queue depth 16: %d polled, %d interrupt-mode (doorbells), %d INTERRUPTs, %d switches", p2, i2, intr, switches)
	for _, ci := range cl.Conns() {
		t.Logf("connection: %d requests, load %.1f, %s", ci.Requests, ci.Load, ci.Completion)
		// Conns reports the load Auto decides by: a busy connection's
		// is above the idle mark (hysteresis), in requests.
		if ci.Completion == "auto/polling" && ci.Load <= float64(autoIdle)/loadOne {
			t.Errorf("a polling connection reports load %.2f, at or below the idle mark %.2f", ci.Load, float64(autoIdle)/loadOne)
		}
		if ci.Requests > 100 && ci.Load == 0 {
			t.Errorf("a connection that carried %d requests at depth 16 reports no load", ci.Requests)
		}
	}
	// Two doorbells (interrupt-mode I/Os) stay in flight beside the polling
	// requests and turn over faster, so about 60% poll (48–64% measured).
	if p2 < n/3 {
		t.Errorf("queue depth 16: only %d of %d I/Os polled", p2, n)
	}
	if intr > n/10 {
		t.Errorf("queue depth 16: %d INTERRUPT requests for %d I/Os (more than 10%%)", intr, n)
	}
	if switches == 0 {
		t.Errorf("no connection switched mode")
	}
	busy := 0
	for _, ci := range cl.Conns() {
		if ci.Completion == "auto/polling" {
			busy++
		}
	}
	if busy == 0 {
		t.Errorf("no connection in polling mode after the depth-16 load")
	}

	// A lone reader keeps to its CPU's connection (pick); the ones it
	// used for more than a few reads (the average takes a dozen to come
	// down) are back in interrupt mode. One it no longer uses keeps its
	// last state until its next request, whose first I/O is a doorbell in
	// interrupt mode anyway.
	before := cl.Conns()
	readLoad(t, f, 200, 1, size)
	used := 0
	for i, ci := range cl.Conns() {
		if ci.Requests-before[i].Requests < 40 {
			continue
		}
		used++
		if ci.Completion != "auto/interrupt" {
			t.Errorf("connection still in %q after the load went", ci.Completion)
		}
	}
	if used == 0 {
		t.Error("no connection carried the last reads")
	}
}

// TestAutoLargeInterrupt: in Auto mode I/O requests larger than
// autoPollMax complete in interrupt mode even on a busy connection (their
// transfer dwarfs a wakeup, and polling them only costs the CPU that moves
// the data), and they do not make it busy; small ones beside them still
// poll.
func TestAutoLargeInterrupt(t *testing.T) {
	const size = 8 << 20
	cl, f := autoFile(t, size)

	const n = 400
	readLoadBS(t, f, n, 16, size, 2*autoPollMax)
	polled, interrupted, switches := sumConns(cl)
	if polled != 0 || interrupted < n || switches != 0 {
		t.Fatalf("%d-byte reads at depth 16: %d polled, %d interrupt-mode, %d switches; want all interrupt mode, no switch", 2*autoPollMax, polled, interrupted, switches)
	}
	for _, ci := range cl.Conns() {
		if ci.Completion != "auto/interrupt" {
			t.Errorf("a connection carrying only large reads is in %q", ci.Completion)
		}
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		readLoadBS(t, f, n, 8, size, 2*autoPollMax)
	}()
	readLoad(t, f, 4000, 16, size)
	wg.Wait()
	p2, _, _ := sumConns(cl)
	if p2 == 0 {
		t.Error("4 KiB reads at depth 16 beside large ones: none polled")
	}
}
