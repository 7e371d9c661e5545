package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// Two LWIO listeners on one provider (one protection domain: lwio-server
// listening on two addresses of one device) share one receive queue:
// connections of both take their receives from it, the buffers are the
// credits of both plus the headroom, and the queue lives while either
// listener's connections use it — the last connection of one listener
// going leaves the other's working.
func TestListenersShareReceivePool(t *testing.T) {
	e := newEnv(t, Config{Credits: 4})
	prov := soft.New(soft.Options{})
	addrs := []string{servertest.ServeOn(t, e.srv, prov), servertest.ServeOn(t, e.srv, prov)}
	type client struct {
		p   *peer
		fid uint16
	}
	var clients []client
	seq := uint64(1)
	connect := func(l, i int) client {
		id := uint64(100 + 10*l + i)
		key, signing := e.session(id)
		rk, _ := e.file(id, fmt.Sprintf("l%d-%d", l, i), testutil.RandBytes(64<<10))
		e.addr = addrs[l]
		p := e.dial()
		p.auth(key, signing, 4)
		return client{p, uint16(p.register(rk, id, 0).Ios.Information)}
	}
	read := func(c client, what string) {
		t.Helper()
		for range 3 {
			c.p.read(c.fid, 0, 4096, 1, seq)
			seq++
			c.p.WantImm(what)
		}
	}
	for l := range 2 {
		for i := range 2 {
			clients = append(clients, connect(l, i))
		}
	}
	for _, c := range clients {
		read(c, "READ beside the other listener's connections")
	}
	var bi BudgetInfo
	testutil.Eventually(t, "4 connections × 4 credits in one queue", 5*time.Second, func() bool {
		bi = e.srv.Budget()
		return bi.RecvBuffers == 4*4+srqHeadroom
	})
	if bi.RecvQueues != 1 || bi.Connections != 4 {
		t.Fatalf("two listeners of one domain, 4 connections: %+v, want 1 shared receive queue", bi)
	}
	p := sharedPool(t, e)
	if posted := postedIn(p); posted != 4*4+srqHeadroom {
		t.Errorf("%d receives posted, want %d", posted, 4*4+srqHeadroom)
	}

	// The first listener's connections go; the second's go on with the
	// same queue.
	for _, c := range clients[:2] {
		c.p.Conn.Close()
	}
	testutil.Eventually(t, "2 connections left", 5*time.Second, func() bool { return e.srv.Budget().Connections == 2 })
	for _, c := range clients[2:] {
		read(c, "READ after the other listener's connections went")
	}
	if q := sharedPool(t, e); q != p {
		t.Error("the shared queue was replaced while the second listener's connections used it")
	}
	// A new connection on the first listener joins the same queue.
	c := connect(0, 5)
	read(c, "READ on a new connection of the first listener")
	if q := sharedPool(t, e); q != p {
		t.Error("a new connection of the first listener got a queue of its own")
	}
	for _, c := range append(clients[2:], c) {
		c.p.Conn.Close()
	}
	testutil.Eventually(t, "the queue and its buffers gone", 5*time.Second, func() bool {
		bi = e.srv.Budget()
		return bi.RecvQueues == 0 && bi.RecvBuffers == 0
	})
}
