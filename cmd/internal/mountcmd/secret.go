package mountcmd

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The password must not stay readable where it came from. A mount runs for
// days; its environment is readable in /proc/PID/environ by every process
// of the user (and root) for as long as it runs, and unsetting a variable
// in Go changes Go's copy, not that memory. So a password given in
// LWIO_PASSWORD is handed over a pipe instead: lwio-mount re-executes
// itself (the same process id, the same arguments) with LWIO_PASSWORD
// taken out of the environment and the password readable on a pipe whose
// descriptor LWIO_PASSWORD_FD names; the new image reads it and closes the
// pipe. A background child (bg, as under mount(8)) is given the password
// the same way. A credentials file (credentials=FILE, mode 0600) is still
// the better way: the mount warns when the password came from the
// environment.

const (
	passwordEnv   = "LWIO_PASSWORD"
	passwordFDEnv = "LWIO_PASSWORD_FD"
)

// scrubPasswordEnv re-executes the program without LWIO_PASSWORD in its
// environment, the password on a pipe, when the variable is set. It
// returns only if that fails (the caller goes on with the variable where
// it is) or there is nothing to do.
func scrubPasswordEnv() error {
	pw, ok := os.LookupEnv(passwordEnv)
	if !ok || os.Getenv(passwordFDEnv) != "" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, err := passwordPipe(pw, false)
	if err != nil {
		return err
	}
	env := append(withoutPassword(os.Environ()), passwordFDEnv+"="+strconv.Itoa(int(r.Fd())))
	err = syscall.Exec(exe, os.Args, env)
	r.Close()
	return fmt.Errorf("re-executing %s without %s: %w", exe, passwordEnv, err)
}

// passwordPipe returns the read end of a pipe that holds pw and is closed
// for writing. cloexec false leaves the descriptor open across exec.
func passwordPipe(pw string, cloexec bool) (*os.File, error) {
	flags := 0
	if cloexec {
		flags = unix.O_CLOEXEC
	}
	var p [2]int
	if err := unix.Pipe2(p[:], flags); err != nil {
		return nil, err
	}
	w := os.NewFile(uintptr(p[1]), "password-w")
	r := os.NewFile(uintptr(p[0]), "password-r")
	// A password is far below the pipe's buffer: the write never blocks.
	_, err := io.WriteString(w, pw)
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	if !cloexec {
		// os.NewFile may have set the descriptor non-blocking; exec'd
		// readers expect a plain one.
		unix.SetNonblock(p[0], false)
	}
	return r, nil
}

// withoutPassword is env with LWIO_PASSWORD and LWIO_PASSWORD_FD taken
// out.
func withoutPassword(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, passwordEnv+"=") || strings.HasPrefix(kv, passwordFDEnv+"=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// handedPassword reads the password a previous image (scrubPasswordEnv)
// or a parent (background) put on the pipe LWIO_PASSWORD_FD names, closes
// it and forgets the variable. ok is false when there is none.
func handedPassword() (pw string, ok bool, err error) {
	s := os.Getenv(passwordFDEnv)
	if s == "" {
		return "", false, nil
	}
	os.Unsetenv(passwordFDEnv)
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 3 {
		return "", false, fmt.Errorf("%s=%q: not a descriptor", passwordFDEnv, s)
	}
	f := os.NewFile(uintptr(fd), "password")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", passwordFDEnv, err)
	}
	return string(b), true, nil
}

// envWithHandedPassword is getenv, except that LWIO_PASSWORD is the
// password handed over a pipe when there was one.
func envWithHandedPassword(pw string, handed bool) func(string) string {
	return func(k string) string {
		if k == passwordEnv && handed {
			return pw
		}
		return os.Getenv(k)
	}
}
