package client

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/server"
	"github.com/lwiofs/lwiofs/protocol/server/servertest"
	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/soft"
)

// twoProviders is a server with a second listener, the address a test
// offers under another provider name ("other").
func twoProviders(t *testing.T) (*env, *session, string) {
	t.Helper()
	e := newEnv(t, server.Config{})
	addr := servertest.ServeOn(t, e.srv, soft.New(soft.Options{}))
	return e, e.session(), addr
}

// offer is a Negotiate answering with the given providers, in order.
func (s *session) offer(ps ...transport.ProviderInfo) func(context.Context, protocol.NegotiateRequest) (protocol.NegotiateResponse, error) {
	return func(context.Context, protocol.NegotiateRequest) (protocol.NegotiateResponse, error) {
		return protocol.NewNegotiateResponse("test", s.e.auth.NegotiateKey(s.id, s.key), ps), nil
	}
}

func instance(t *testing.T, addr string) []transport.Instance {
	t.Helper()
	in, err := transport.InstanceFor(addr)
	if err != nil {
		t.Fatal(err)
	}
	return []transport.Instance{in}
}

// provider=auto with verbs and softrdma both common must not spread a
// mount's connections over both: every connection goes to the client's
// first choice, whatever order the server lists them in, and falls back
// per connection only when that provider cannot be reached.
func TestConnectionsUseThePreferredProvider(t *testing.T) {
	e, s, otherAddr := twoProviders(t)
	first := renamed{soft.New(soft.Options{})} // "other": the client's first choice
	cfg := s.config(Interrupt)
	cfg.Providers = []transport.Provider{first, soft.New(soft.Options{})}
	cfg.Connections = 4
	cfg.Negotiate = s.offer(
		transport.ProviderInfo{Name: soft.Name, Instances: instance(t, e.addr)},
		transport.ProviderInfo{Name: "other", Instances: instance(t, otherAddr)},
	)
	cl := s.client(t, cfg)
	for i, ci := range cl.Conns() {
		if ci.RemoteAddr != otherAddr {
			t.Errorf("connection %d went to %s, want the preferred provider's %s", i, ci.RemoteAddr, otherAddr)
		}
	}
	if len(cl.Conns()) != 4 {
		t.Fatalf("%d connections, want 4", len(cl.Conns()))
	}

	t.Run("fallback", func(t *testing.T) {
		dead := "127.0.0.1:1" // nothing listens there
		cfg.Negotiate = s.offer(
			transport.ProviderInfo{Name: soft.Name, Instances: instance(t, e.addr)},
			transport.ProviderInfo{Name: "other", Instances: instance(t, dead)},
		)
		cl := s.client(t, cfg)
		if n := len(cl.Conns()); n != 4 {
			t.Fatalf("%d connections, want 4", n)
		}
		for i, ci := range cl.Conns() {
			if ci.RemoteAddr != e.addr {
				t.Errorf("connection %d went to %s, want the fallback %s", i, ci.RemoteAddr, e.addr)
			}
		}
	})
}

// Requests in flight at once spread over the connections (item 2 of issue
// 16: a connection, and its completion queue, per CPU): none is left idle
// while another queues.
func TestRequestsSpreadOverConnections(t *testing.T) {
	e := newEnv(t, server.Config{})
	s := e.session()
	cfg := s.config(Interrupt)
	cfg.Connections = 4
	cl := s.client(t, cfg)
	f := s.newFile(t, cl, "f", testutil.RandBytes(1<<20))
	before := make([]uint64, 4)
	for i, ci := range cl.Conns() {
		before[i] = ci.Requests
	}
	const workers, each = 32, 16
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 4096)
			for i := 0; i < each; i++ {
				if _, err := f.ReadAt(ctx, p, int64((w*each+i)%256)*4096); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	const fair = workers * each / 4
	for i, ci := range cl.Conns() {
		if n := ci.Requests - before[i]; n < fair/4 {
			t.Errorf("connection %d carried %d of %d requests (fair share %d)", i, n, workers*each, fair)
		}
	}
}

func TestDefaultConnections(t *testing.T) {
	if n := DefaultConnections(); n < 2 || n > maxDefaultConnections || (runtime.NumCPU() >= 2 && runtime.NumCPU() <= maxDefaultConnections && n != runtime.NumCPU()) {
		t.Fatalf("DefaultConnections() = %d with %d CPUs", n, runtime.NumCPU())
	}
	e := newEnv(t, server.Config{})
	_, cl := e.newClient(t, Interrupt)
	if n := len(cl.Conns()); n != DefaultConnections() {
		t.Fatalf("a client with Connections 0 has %d connections, want %d", n, DefaultConnections())
	}
}
