// Package ctl is a running mount's control endpoint: a UNIX socket the
// lwio-mount process listens on, through which `lwio stat` (and later
// subcommands: each is a handler registered by name) talk to the mount
// without restarting it.
//
// Where: one socket per mount, named by the mount's device number (the
// st_dev of its files, major:minor as /proc/self/mountinfo shows it), so a
// command finds it from the mount point alone:
//
//	/run/lwio/MAJOR:MINOR.sock                 mounts made by root
//	$XDG_RUNTIME_DIR/lwio/MAJOR:MINOR.sock     a user's own mounts (/run/user/UID/lwio)
//
// Who: the socket file is 0666 where the mount allows other users
// (allow_other) and 0600 otherwise; the server checks every caller with
// SO_PEERCRED — root, the mount's owner, and with allow_other anyone, as
// the kernel lets them use the mount itself. The caller in turn checks that
// the socket and the process behind it belong to the mount's owner, so a
// user cannot plant a socket that answers for someone else's mount.
//
// Protocol: one JSON request a line ({"op":"stat","args":…}), one JSON
// response a line ({"result":…} or {"error":"…"}); a connection may carry
// several.
package ctl

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Request is one call as a handler sees it.
type Request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
	// Peer is the caller's process, from SO_PEERCRED.
	Peer unix.Ucred `json:"-"`
}

// Decode decodes the request's arguments into v.
func (r Request) Decode(v any) error {
	if len(r.Args) == 0 {
		return errors.New("missing arguments")
	}
	return json.Unmarshal(r.Args, v)
}

type response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Handler answers one operation; its result is sent as JSON.
type Handler func(req Request) (any, error)

// Server is a mount's control endpoint.
type Server struct {
	l     *net.UnixListener
	path  string
	owner int  // the mount's owner
	open  bool // allow_other: any local user may ask
	log   logrus.FieldLogger

	mu       sync.Mutex
	handlers map[string]Handler
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// Dir is where the sockets of uid's mounts live: /run/lwio for root, else
// the user's runtime directory ($XDG_RUNTIME_DIR when it is the user's
// /run/user/UID, else that path if it exists, else a 0700 directory in
// the temporary directory).
func Dir(uid int) string {
	if uid == 0 {
		return "/run/lwio"
	}
	run := fmt.Sprintf("/run/user/%d", uid)
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && os.Getuid() == uid {
		run = x
	} else if _, err := os.Stat(run); err != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf("lwio-%d", uid))
	}
	return filepath.Join(run, "lwio")
}

// SocketName is the socket's file name for a mount of device dev
// ("MAJOR:MINOR").
func SocketName(dev string) string { return dev + ".sock" }

// Listen creates the socket at dir/SocketName(dev) and serves it until
// Close. owner is the mount's owner; allowOther lets every local user ask.
// A stale socket of a mount that is gone is replaced; a live one, or a
// file that belongs to someone else, is an error.
func Listen(dir, dev string, owner int, allowOther bool, log logrus.FieldLogger) (*Server, error) {
	if err := ownDir(dir, owner); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, SocketName(dev))
	if st, err := os.Lstat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another process answers there", path)
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Geteuid() {
			return nil, fmt.Errorf("control socket %s: a stale file of another user is in the way", path)
		}
		os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mode := os.FileMode(0o600)
	if allowOther {
		mode = 0o666
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s := &Server{l: l, path: path, owner: owner, open: allowOther, log: log,
		handlers: map[string]Handler{}, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// ownDir makes dir (0755 for root's /run/lwio, 0700 for a user's) or checks
// that an existing one is owned by us and not writable by others.
func ownDir(dir string, owner int) error {
	mode := os.FileMode(0o700)
	if owner == 0 {
		mode = 0o755
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return fmt.Errorf("control socket directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || !st.IsDir() || int(sys.Uid) != os.Geteuid() || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("control socket directory %s: not a directory of ours writable only by us", dir)
	}
	return nil
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Handle registers h for op, replacing any earlier one.
func (s *Server) Handle(op string, h Handler) {
	s.mu.Lock()
	s.handlers[op] = h
	s.mu.Unlock()
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.l.Close() // removes the socket file (net.UnixListener unlinks it)
	s.wg.Wait()
	return err
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// maxRequest bounds one request line.
const maxRequest = 64 << 10

func (s *Server) serveConn(c *net.UnixConn) {
	cred, err := peerCred(c)
	log := s.log
	if err == nil {
		log = log.WithFields(logrus.Fields{"uid": cred.Uid, "pid": cred.Pid})
	}
	enc := json.NewEncoder(c)
	if err != nil || !s.allowed(cred) {
		why := "permission denied: not the mount's owner, and the mount is not allow_other"
		if err != nil {
			why = "cannot identify the caller: " + err.Error()
		}
		log.WithField("reason", why).Warn("control: request refused")
		enc.Encode(response{Error: why})
		return
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 4096), maxRequest)
	for sc.Scan() {
		var req Request
		var resp response
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			resp.Error = "bad request: " + err.Error()
		} else {
			req.Peer = *cred
			resp = s.call(req)
		}
		if err := enc.Encode(resp); err != nil {
			return
		}
	}
}

func (s *Server) call(req Request) response {
	s.mu.Lock()
	h := s.handlers[req.Op]
	s.mu.Unlock()
	if h == nil {
		return response{Error: fmt.Sprintf("unknown operation %q", req.Op)}
	}
	v, err := h(req)
	if err != nil {
		return response{Error: err.Error()}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return response{Error: err.Error()}
	}
	return response{Result: b}
}

// allowed: root, the mount's owner, and with allow_other everyone.
func (s *Server) allowed(c *unix.Ucred) bool {
	return c.Uid == 0 || int(c.Uid) == s.owner || s.open
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred, errors.Join(err, cerr)
}

// Call connects to the socket at path, checks that the file and the
// process listening on it belong to uid owner (the mount's), sends one
// request and decodes its result into out.
func Call(path string, owner int, op string, args, out any) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || st.Mode()&os.ModeSocket == 0 || int(sys.Uid) != owner {
		return fmt.Errorf("%s is not a socket of the mount's owner (uid %d)", path, owner)
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	cred, err := peerCred(uc)
	if err != nil {
		return err
	}
	if int(cred.Uid) != owner && cred.Uid != 0 {
		return fmt.Errorf("%s: answered by uid %d, not the mount's owner %d", path, cred.Uid, owner)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := map[string]any{"op": op}
	if args != nil {
		req["args"] = args
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return err
	}
	var resp response
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&resp); err != nil {
		return fmt.Errorf("%s: no answer: %w", path, err)
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(resp.Result, out)
}

// Owner parses the user_id= of a FUSE mount's super options ("" → -1).
func Owner(userID string) int {
	n, err := strconv.Atoi(userID)
	if err != nil {
		return -1
	}
	return n
}
