package soft

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// The same-host path. A peer on the same host (the same network
// namespace) moves its connection from TCP loopback to an AF_UNIX stream
// socket, which copies each byte once per direction with none of TCP's
// per-segment work. The client always dials TCP first, so it finds the
// unix socket only through the server it reached:
//
//   - Listen also listens on an abstract unix socket whose name carries
//     128 random bits, "@lwiofs-softrdma-" and 32 hex digits, bound before
//     it is ever told to anyone.
//   - Both hellos carry helloLocal (the server offers, the client asks).
//     When both do, the server sends an offer over TCP: the name's random
//     part, and two random 16-byte tokens for this connection only.
//   - The client connects to the name and sends the client token; the
//     server answers with the server token only on the unix socket that
//     sent the client token, which it then hands to the TCP hello waiting
//     for it. The client checks the server token and says 'U' on TCP (it
//     moved) or, if anything failed, 'T' (it stays on TCP).
//
// Both ends take the step only when their TCP connection joins two
// sockets of one host (sameHost; Provider.sameHost in tests): a client of a server on another host
// never dials a name in its own namespace, where a local user may have
// bound it.
//
// A local user who learns the name (any TCP client on the host gets an
// offer) cannot bind it while the listener lives, and cannot answer for a
// connection it did not see the tokens of; at worst it connects to the
// name and makes the server read 16 bytes. See docs/security.md.

// EnvTCPOnly, set to 1, makes both binaries' softrdma providers TCPOnly
// (TCPOnlyFromEnv): for a comparison, or a host where the unix socket
// misbehaves.
const EnvTCPOnly = "LWIO_SOFT_TCP"

// TCPOnlyFromEnv reports whether EnvTCPOnly is "1".
func TCPOnlyFromEnv() bool { return os.Getenv(EnvTCPOnly) == "1" }

// EnvNoPipes, set to 1, gives both binaries' softrdma providers NoPipes
// (NoPipesFromEnv): for a comparison.
const EnvNoPipes = "LWIO_SOFT_NOPIPES"

// NoPipesFromEnv reports whether EnvNoPipes is "1".
func NoPipesFromEnv() bool { return os.Getenv(EnvNoPipes) == "1" }

// Carrier names what a connection runs over: TCP, a unix socket, or two
// pipes passed over one (local_pipe.go); "+shm" when the dialer's
// registered memory is shared too (shm.go).
const (
	CarrierTCP     = "tcp"
	CarrierUnix    = "unix"
	CarrierShm     = "unix+shm"
	CarrierPipe    = "pipe"     // two pipes, passed over the unix socket (local_pipe.go)
	CarrierPipeShm = "pipe+shm" // pipes, and shared memory (shm.go)
)

const (
	localPrefix  = "@lwiofs-softrdma-"
	localIDSize  = 16
	localTokSize = 16
	offerSize    = localIDSize + 2*localTokSize
	decideUnix   = 'U'
	decideTCP    = 'T'
)

// sock is the stream socket a connection runs over: *net.TCPConn or
// *net.UnixConn.
type sock interface {
	net.Conn
	SyscallConn() (syscall.RawConn, error)
	CloseWrite() error
}

// offer is what the server sends over TCP when both ends asked for the
// same-host path.
type offer struct {
	id        [localIDSize]byte
	cli, serv [localTokSize]byte
}

func (o *offer) encode(b []byte) {
	copy(b, o.id[:])
	copy(b[localIDSize:], o.cli[:])
	copy(b[localIDSize+localTokSize:], o.serv[:])
}

func (o *offer) decode(b []byte) {
	copy(o.id[:], b)
	copy(o.cli[:], b[localIDSize:])
	copy(o.serv[:], b[localIDSize+localTokSize:])
}

func localName(id [localIDSize]byte) string { return localPrefix + hex.EncodeToString(id[:]) }

// sameHost reports whether tc's two ends are on this host, in this
// network namespace: they have the same address, as a connection to one
// of the host's own addresses has, or both are loopback addresses, which
// never leave it (a hostname in /etc/hosts as 127.0.1.1 is dialled from
// 127.0.0.1). A connection from another host, or from a container behind
// its own address, has two. Only then does either end offer or ask for
// the same-host path: a client that dialled another host would otherwise
// present its client token to whatever holds the offered name in its own
// namespace (a local user can bind any free abstract name), and a hostile
// server elsewhere could relay the offer of a server on the client's host
// and have the client attached to it.
func sameHost(tc *net.TCPConn) bool { return sameHostAddrs(tc.LocalAddr(), tc.RemoteAddr()) }

func sameHostAddrs(local, remote net.Addr) bool {
	l, lok := local.(*net.TCPAddr)
	r, rok := remote.(*net.TCPAddr)
	return lok && rok && (l.IP.Equal(r.IP) || l.IP.IsLoopback() && r.IP.IsLoopback())
}

// localListener is a listener's unix socket and the offers waiting for
// their client to arrive on it.
type localListener struct {
	l       *listener
	ln      *net.UnixListener
	id      [localIDSize]byte
	mu      sync.Mutex
	pending map[[localTokSize]byte]*pendingOffer
	sem     chan struct{}
}

type pendingOffer struct {
	serv [localTokSize]byte
	got  chan *net.UnixConn // one slot: the unix socket that presented the token
}

// listenLocal binds the listener's unix socket; it returns nil (and the
// listener offers nothing) when that fails.
func (l *listener) listenLocal() *localListener {
	ll := &localListener{l: l, pending: make(map[[localTokSize]byte]*pendingOffer), sem: make(chan struct{}, maxHandshakes)}
	if _, err := rand.Read(ll.id[:]); err != nil {
		return nil
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: localName(ll.id), Net: "unix"})
	if err != nil {
		l.p.log.WithError(err).Warn("softrdma: no same-host unix socket; peers on this host use TCP")
		return nil
	}
	ll.ln = ln
	l.wg.Add(1)
	go ll.acceptLoop()
	return ll
}

func (ll *localListener) acceptLoop() {
	defer ll.l.wg.Done()
	for {
		uc, err := ll.ln.AcceptUnix()
		if err != nil {
			select {
			case <-ll.l.closed:
				return
			default:
			}
			ll.l.p.log.WithError(err).Warn("softrdma: unix accept failed")
			select {
			case <-ll.l.closed:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		select {
		case ll.sem <- struct{}{}:
		default:
			_ = uc.Close() // too many at once: the client falls back to TCP
			continue
		}
		ll.l.wg.Add(1)
		go func() {
			defer ll.l.wg.Done()
			defer func() { <-ll.sem }()
			ll.claim(uc)
		}()
	}
}

// claim reads a client token from uc and, if an offer is waiting for it,
// hands uc to that offer's hello and answers with the server token.
func (ll *localListener) claim(uc *net.UnixConn) {
	_ = uc.SetDeadline(time.Now().Add(ll.l.p.opts.HandshakeTimeout))
	stop := context.AfterFunc(ll.l.ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var tok [localTokSize]byte
	if _, err := io.ReadFull(uc, tok[:]); err != nil {
		_ = uc.Close()
		return
	}
	if !stop() { // the listener is closing
		_ = uc.Close()
		return
	}
	_ = uc.SetDeadline(time.Time{})
	// Deliver under the lock that takes the token out of pending, so a
	// hello that withdraws its offer either finds uc there (and closes
	// it) or has withdrawn before: never an fd left in an offer nobody
	// will read. Deliver before the server token: the client says 'U' on
	// TCP only once it has read it, so the hello waiting there finds the
	// socket. The one slot is filled once, the token leaving pending.
	ll.mu.Lock()
	po := ll.pending[tok]
	delete(ll.pending, tok)
	if po != nil {
		po.got <- uc
	}
	ll.mu.Unlock()
	if po == nil {
		ll.l.p.log.Info("softrdma: unix connection with an unknown token refused")
		_ = uc.Close()
		return
	}
	// 16 bytes into an empty socket buffer: the write does not block.
	_, _ = uc.Write(po.serv[:])
}

// makeOffer registers a new offer; withdraw forgets it.
func (ll *localListener) makeOffer() (*offer, *pendingOffer, error) {
	o := &offer{id: ll.id}
	if _, err := rand.Read(o.cli[:]); err != nil {
		return nil, nil, err
	}
	if _, err := rand.Read(o.serv[:]); err != nil {
		return nil, nil, err
	}
	po := &pendingOffer{serv: o.serv, got: make(chan *net.UnixConn, 1)}
	ll.mu.Lock()
	ll.pending[o.cli] = po
	ll.mu.Unlock()
	return o, po, nil
}

func (ll *localListener) withdraw(o *offer, po *pendingOffer) {
	ll.mu.Lock()
	if ll.pending[o.cli] == po {
		delete(ll.pending, o.cli)
	}
	ll.mu.Unlock()
	select {
	case uc := <-po.got:
		_ = uc.Close()
	default:
	}
}

// serveOffer runs the server's side of the same-host step on an accepted
// TCP connection whose hello asked for it: it returns the socket the
// connection goes on with, tc or the unix socket the client moved to. The
// handshake deadline is set on tc.
func (ll *localListener) serveOffer(tc *net.TCPConn) (sock, error) {
	o, po, err := ll.makeOffer()
	if err != nil {
		return nil, err
	}
	defer ll.withdraw(o, po)
	var b [offerSize]byte
	o.encode(b[:])
	if _, err := tc.Write(b[:]); err != nil {
		return nil, err
	}
	var d [1]byte
	if _, err := io.ReadFull(tc, d[:]); err != nil {
		return nil, err
	}
	switch d[0] {
	case decideTCP:
		return tc, nil
	case decideUnix:
	default:
		return nil, fmt.Errorf("softrdma: bad same-host decision %q", d[0])
	}
	// The client says 'U' only after reading the server token, which
	// claim writes after delivering the socket (a client that lies finds
	// its connection refused).
	select {
	case uc := <-po.got:
		_ = tc.Close()
		ll.l.p.sizeLocal(uc)
		return uc, nil
	default:
		return nil, errors.New("softrdma: client moved to a unix socket that never presented its token")
	}
}

func (ll *localListener) close() { _ = ll.ln.Close() }

// takeOffer runs the client's side of the same-host step after the hellos:
// it reads the server's offer, connects to the unix socket named in it and
// proves both ends, then tells the server over tc whether it moved. It
// returns the socket the connection goes on with. A unix socket that is
// not there (another host, another network namespace) or does not answer
// with the server token leaves the connection on TCP.
func (p *Provider) takeOffer(ctx context.Context, tc *net.TCPConn) (sock, error) {
	var b [offerSize]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		return nil, err
	}
	var o offer
	o.decode(b[:])
	uc, err := p.dialLocal(ctx, &o)
	if err != nil {
		p.log.WithError(err).Debug("softrdma: same-host socket unusable; staying on TCP")
		if _, err := tc.Write([]byte{decideTCP}); err != nil {
			return nil, err
		}
		return tc, nil
	}
	if _, err := tc.Write([]byte{decideUnix}); err != nil {
		_ = uc.Close()
		return nil, err
	}
	p.sizeLocal(uc)
	_ = tc.Close()
	return uc, nil
}

// dialLocal connects to the offer's unix socket and exchanges the tokens.
func (p *Provider) dialLocal(ctx context.Context, o *offer) (*net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", localName(o.id))
	if err != nil {
		return nil, err
	}
	uc := nc.(*net.UnixConn)
	dl, _ := ctx.Deadline()
	_ = uc.SetDeadline(dl)
	var tok [localTokSize]byte
	_, err = uc.Write(o.cli[:])
	if err == nil {
		_, err = io.ReadFull(uc, tok[:])
	}
	if err == nil && subtle.ConstantTimeCompare(tok[:], o.serv[:]) != 1 {
		err = errors.New("the unix socket answered with the wrong token")
	}
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	return uc, uc.SetDeadline(time.Time{})
}

// localBuffer is the unix socket's send buffer. The kernel's default
// (net.core.wmem_default, 208 KiB here) takes a 1 MiB frame in five
// fills, each a wake-up of both ends; a unix stream socket's receiver
// has no buffer of its own (it is charged to the sender's), so this
// bounds the bytes in flight. Linux caps it at net.core.wmem_max.
const localBuffer = 4 << 20

func (p *Provider) sizeLocal(uc *net.UnixConn) {
	n := localBuffer
	if p.opts.SocketBuffer > 0 {
		n = p.opts.SocketBuffer
	}
	_ = uc.SetWriteBuffer(n)
}
