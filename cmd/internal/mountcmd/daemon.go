package mountcmd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// childEnv marks the re-executed background process; its value is the
// file descriptor on which it reports "ok" or the error.
const childEnv = "LWIO_MOUNT_CHILD_FD"

// startedByMountHelper reports whether an ancestor within three
// generations is mount(8) or mount.fuse3: then we are the helper behind an
// fstab line, and mount waits for us, so we must return once mounted.
func startedByMountHelper() bool {
	pid := os.Getppid()
	for range 3 {
		if pid <= 1 {
			return false
		}
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if err != nil {
			return false
		}
		c := strings.TrimSpace(string(comm))
		if c == "mount" || strings.HasPrefix(c, "mount.fuse") {
			return true
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at ')'.
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 2 {
			return false
		}
		pid, _ = strconv.Atoi(fields[1])
	}
	return false
}

// background re-executes the program detached (new session, no terminal)
// and waits until the child reports the mount up or failed. It returns the
// child's error, or nil once mounted. A password that came from the
// environment (secret) goes to the child over a pipe, not in its
// environment (secret.go).
func background(logFile, secret string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	stderr := null
	if logFile != "" {
		if stderr, err = os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err != nil {
			return fmt.Errorf("log file: %w", err)
		}
		defer stderr.Close()
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(withoutPassword(os.Environ()), childEnv+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, stderr
	cmd.ExtraFiles = []*os.File{w}
	if secret != "" {
		pr, err := passwordPipe(secret, true)
		if err != nil {
			w.Close()
			r.Close()
			return err
		}
		defer pr.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, pr)
		cmd.Env = append(cmd.Env, passwordFDEnv+"=4")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		return err
	}
	w.Close()
	defer r.Close()
	line, rerr := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		cmd.Process.Release()
		return nil
	}
	werr := cmd.Wait()
	if line != "" {
		return errors.New(line)
	}
	if werr != nil {
		return fmt.Errorf("background process failed before mounting: %v", werr)
	}
	return fmt.Errorf("background process exited before mounting: %v", rerr)
}

// readyReporter tells a waiting parent (see background) how the mount
// went; outside background mode it does nothing.
type readyReporter struct{ f *os.File }

func newReadyReporter() *readyReporter {
	fd, err := strconv.Atoi(os.Getenv(childEnv))
	if err != nil || fd < 3 {
		return &readyReporter{}
	}
	os.Unsetenv(childEnv)
	return &readyReporter{f: os.NewFile(uintptr(fd), "ready")}
}

func (r *readyReporter) report(err error) {
	if r.f == nil {
		return
	}
	if err == nil {
		fmt.Fprintln(r.f, "ok")
	} else {
		fmt.Fprintln(r.f, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	r.f.Close()
	r.f = nil
}

func (r *readyReporter) active() bool { return r.f != nil }
