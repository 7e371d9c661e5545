package mountcmd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// A multiuser mount listens on a control socket where a local user adds
// credentials to the running mount (`lwio login`) or drops them (`lwio
// logout`). The socket is in the abstract namespace, named after the
// mountpoint: nothing to create or clean up, reachable by every local user
// — who is asking comes from the kernel (SO_PEERCRED), never from the
// message. `lwio login` checks the other way round that the listener is
// the mount's owner (the FUSE mount's user_id), so another user cannot
// pose as the mount to collect passwords.

// controlName is the abstract socket name of the mount at mountpoint.
func controlName(mountpoint string) string {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		abs = mountpoint
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	return "@lwio-mount/" + hex.EncodeToString(sum[:16])
}

// controlRequest is one line a client sends.
type controlRequest struct {
	Op       string `json:"op"` // "login" or "logout"
	Username string `json:"username,omitempty"`
	Domain   string `json:"domain,omitempty"`
	Password string `json:"password,omitempty"`
}

// controlReply is the line the mount answers.
type controlReply struct {
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
}

// Bounds of the control socket: a request line, the time a client may
// take to send it, and logins tried at once.
const (
	maxControlLine  = 64 << 10
	controlDeadline = 30 * time.Second
	maxLoginsAtOnce = 4
)

// control serves a multiuser mount's control socket.
type control struct {
	l     *net.UnixListener
	creds *userCreds
	mu    *fs.MultiUser
	log   logrus.FieldLogger
	slots chan struct{}
	wg    sync.WaitGroup
}

// listenControl opens the mount's control socket and serves it until
// Close.
func listenControl(mountpoint string, creds *userCreds, mu *fs.MultiUser, log logrus.FieldLogger) (*control, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: controlName(mountpoint), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket for lwio login: %w", err)
	}
	c := &control{l: l, creds: creds, mu: mu, log: log.WithField("component", "control"), slots: make(chan struct{}, maxLoginsAtOnce)}
	c.wg.Add(1)
	go c.serve()
	return c, nil
}

// Close stops serving and waits for the requests being answered.
func (c *control) Close() error {
	err := c.l.Close()
	c.wg.Wait()
	return err
}

func (c *control) serve() {
	defer c.wg.Done()
	for {
		conn, err := c.l.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				c.log.WithError(err).Warn("control socket: accept")
			}
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer conn.Close()
			c.handle(conn)
		}()
	}
}

// peerCred is the kernel's word on who is at the other end of conn.
func peerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (c *control) handle(conn *net.UnixConn) {
	cred, err := peerCred(conn)
	if err != nil {
		c.log.WithError(err).Warn("control socket: no peer credentials; closing")
		return
	}
	log := c.log.WithFields(logrus.Fields{"uid": cred.Uid, "pid": cred.Pid})
	conn.SetDeadline(time.Now().Add(controlDeadline))
	reply := func(r controlReply) {
		b, _ := json.Marshal(r)
		conn.Write(append(b, '\n'))
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 4096), maxControlLine)
	if !sc.Scan() {
		return
	}
	var req controlRequest
	if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
		log.WithError(err).Warn("control socket: malformed request")
		reply(controlReply{Message: "malformed request"})
		return
	}
	switch req.Op {
	case "login":
		reply(c.login(log, cred.Uid, credentials{username: req.Username, domain: req.Domain, password: req.Password}))
	case "logout":
		had := c.creds.logout(cred.Uid)
		c.mu.Forget(cred.Uid)
		log.WithField("had_login", had).Info("multiuser: credentials dropped by lwio logout")
		reply(controlReply{OK: true, Message: "credentials dropped; sessions with files open end when they are closed"})
	default:
		reply(controlReply{Message: fmt.Sprintf("unknown request %q", req.Op)})
	}
}

// login checks credentials with a logon of their own before the mount
// uses them for uid, so a typo is reported to the user, not turned into
// EACCES later.
func (c *control) login(log logrus.FieldLogger, uid uint32, cr credentials) controlReply {
	if cr.username == "" || cr.password == "" {
		return controlReply{Message: "a user name and a password are needed"}
	}
	c.slots <- struct{}{}
	defer func() { <-c.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	s, err := c.creds.o.userDialer(cr, c.creds.log)(ctx)
	if err != nil {
		log.WithField("user", cr.username).WithError(err).Warn("multiuser: lwio login refused")
		if errors.Is(err, session.ErrLogonFailure) {
			return controlReply{Message: fmt.Sprintf("logon as %q failed: wrong user name or password", cr.username)}
		}
		return controlReply{Message: oneLine(err)}
	}
	s.Close()
	c.creds.login(uid, cr)
	c.mu.Forget(uid)
	log.WithField("user", cr.username).Info("multiuser: credentials added by lwio login")
	return controlReply{OK: true, Message: fmt.Sprintf("logged on as %q: the mount now acts as that user for uid %d", cr.username, uid)}
}
