package mountcmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/cmd/internal/ctl"
	"github.com/lwiofs/lwiofs/fs"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// A multiuser mount answers two more operations on its control endpoint
// (cmd/internal/ctl, the socket `lwio stat` uses): "login", by which a
// local user adds credentials to the running mount (`lwio login`), and
// "logout", which drops them. Who is asking comes from the kernel
// (SO_PEERCRED, ctl.Request.Peer), never from the message; `lwio login`
// checks the other way round that the socket and the process behind it
// are the mount's owner's (ctl.Call), so a password goes to the mount
// only. A multiuser mount is allow_other, so every local user may ask.

// userMount is what the login operations act on.
type userMount struct {
	creds *userCreds
	mu    *fs.MultiUser
	log   logrus.FieldLogger
	slots chan struct{} // logins checked at once
}

// maxLoginsAtOnce bounds the logons `lwio login` runs at once.
const maxLoginsAtOnce = 4

// loginArgs are the arguments of "login".
type loginArgs struct {
	Username string `json:"username"`
	Domain   string `json:"domain,omitempty"`
	Password string `json:"password"`
}

// serve registers the operations on the mount's control endpoint; a
// mount without multiuser (u nil) has none.
func (u *userMount) serve(srv *ctl.Server) {
	if u == nil || srv == nil {
		return
	}
	srv.Handle("login", u.login)
	srv.Handle("logout", u.logout)
}

// login checks the credentials with a logon of their own before the mount
// uses them for the caller's uid, so a typo is reported to the user, not
// turned into EACCES later.
func (u *userMount) login(req ctl.Request) (any, error) {
	var a loginArgs
	if err := req.Decode(&a); err != nil {
		return nil, err
	}
	if a.Username == "" || a.Password == "" {
		return nil, errors.New("a user name and a password are needed")
	}
	uid := req.Peer.Uid
	log := u.log.WithFields(logrus.Fields{"uid": uid, "pid": req.Peer.Pid, "user": a.Username})
	u.slots <- struct{}{}
	defer func() { <-u.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	c := credentials{username: a.Username, domain: a.Domain, password: a.Password}
	s, err := u.creds.o.userDialer(c, u.creds.log)(ctx)
	if err != nil {
		log.WithError(err).Warn("multiuser: lwio login refused")
		if errors.Is(err, session.ErrLogonFailure) {
			return nil, fmt.Errorf("logon as %q failed: wrong user name or password", a.Username)
		}
		return nil, errors.New(oneLine(err))
	}
	s.Close()
	u.creds.login(uid, c)
	u.mu.Forget(uid)
	log.Info("multiuser: credentials added by lwio login")
	return fmt.Sprintf("logged on as %q: the mount now acts as that user for uid %d", a.Username, uid), nil
}

// logout drops the caller's credentials from `lwio login`; its session
// ends once none of its files is open.
func (u *userMount) logout(req ctl.Request) (any, error) {
	uid := req.Peer.Uid
	had := u.creds.logout(uid)
	u.mu.Forget(uid)
	u.log.WithFields(logrus.Fields{"uid": uid, "had_login": had}).Info("multiuser: credentials dropped by lwio logout")
	return "credentials dropped; a session with files open ends when they are closed", nil
}
