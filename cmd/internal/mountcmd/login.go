package mountcmd

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"
)

// runLogin is `lwio login` and `lwio logout`: a local user adds their own
// credentials to a running multiuser mount, or drops them, through the
// mount's control socket (control.go).
func runLogin(prog, op string, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	fl := flag.NewFlagSet(prog+" "+op, flag.ContinueOnError)
	fl.SetOutput(stderr)
	credFile := fl.String("credentials", "", "read username=, password=, domain= from this file")
	userName := fl.String("user", "", "the user to log on as (default: your local user name)")
	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, op, oneLine(err))
		return 1
	}
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() != 1 {
		fmt.Fprintf(stderr, "usage: %s %s [-user NAME] [-credentials FILE] //HOST[:PORT]/SHARE | MOUNTPOINT\n", prog, op)
		return 2
	}
	mnt, owner, err := findMount(fl.Arg(0))
	if err != nil {
		return fail(err)
	}
	req := controlRequest{Op: op}
	if op == "login" {
		c, err := loginCredentials(*credFile, *userName, getenv("LWIO_PASSWORD"), stdin, stderr)
		if err != nil {
			return fail(err)
		}
		req.Username, req.Domain, req.Password = c.username, c.domain, c.password
	}
	rep, err := ask(mnt, owner, req)
	if err != nil {
		return fail(err)
	}
	if !rep.OK {
		return fail(errors.New(rep.Message))
	}
	fmt.Fprintf(stdout, "%s: %s\n", mnt, rep.Message)
	return 0
}

// loginCredentials are the credentials to send: a credentials file, or a
// user name (-user, else the local one) and a password: envPassword (from
// LWIO_PASSWORD), else from the terminal (not echoed) or one line of
// standard input.
func loginCredentials(file, name, envPassword string, stdin io.Reader, prompt io.Writer) (credentials, error) {
	if file != "" {
		c, err := readCredentialsFile(file)
		if err == nil && name != "" {
			c.username = name
		}
		splitDomain(&c.username, &c.domain)
		return c, err
	}
	c := credentials{username: name}
	if c.username == "" {
		u, err := user.Current()
		if err != nil {
			return c, fmt.Errorf("no -user given and no local user name: %v", err)
		}
		c.username = u.Username
	}
	splitDomain(&c.username, &c.domain)
	c.password = envPassword
	if c.password != "" {
		return c, nil
	}
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintf(prompt, "Password for %s: ", c.username)
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		c.password = string(b)
		return c, err
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	c.password = strings.TrimRight(line, "\r\n")
	if c.password == "" {
		return c, fmt.Errorf("no password: type it, or set LWIO_PASSWORD, or give -credentials FILE (%v)", err)
	}
	return c, nil
}

// findMount finds the lwio mount named by arg — its source
// (//HOST[:PORT]/SHARE, which must name exactly one mount) or its
// mountpoint — and the uid that mounted it (the FUSE mount's user_id).
func findMount(arg string) (mnt string, owner uint32, err error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", 0, err
	}
	mounts := lwioMounts(string(b))
	var want string
	if strings.HasPrefix(arg, "//") || strings.HasPrefix(arg, `\\`) {
		host, port, share, err := parseSource(arg)
		if err != nil {
			return "", 0, err
		}
		want = (&Options{Host: host, Port: port, Share: share}).Source()
	} else if arg, err = filepath.Abs(arg); err != nil {
		return "", 0, err
	}
	var found []lwioMount
	for _, m := range mounts {
		if want != "" && strings.EqualFold(m.source, want) || want == "" && m.dir == arg {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return "", 0, fmt.Errorf("no lwio mount of %s here", arg)
	case 1:
		return found[0].dir, found[0].owner, nil
	}
	var dirs []string
	for _, m := range found {
		dirs = append(dirs, m.dir)
	}
	return "", 0, fmt.Errorf("%s is mounted at %s: name the mountpoint", arg, strings.Join(dirs, ", "))
}

// lwioMount is one fuse.lwio line of /proc/self/mountinfo.
type lwioMount struct {
	dir, source string
	owner       uint32
}

// lwioMounts lists the fuse.lwio mounts of a mountinfo text: "id parent
// maj:min root mountpoint opts [optional...] - fstype source superopts".
func lwioMounts(info string) []lwioMount {
	var out []lwioMount
	for _, line := range strings.Split(info, "\n") {
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(f) || f[sep+1] != "fuse.lwio" {
			continue
		}
		m := lwioMount{dir: unescapeOctal(f[4]), source: unescapeOctal(f[sep+2]), owner: 1<<32 - 1}
		if sep+3 < len(f) {
			for _, o := range strings.Split(f[sep+3], ",") {
				if v, ok := strings.CutPrefix(o, "user_id="); ok {
					if n, err := strconv.ParseUint(v, 10, 32); err == nil {
						m.owner = uint32(n)
					}
				}
			}
		}
		out = append(out, m)
	}
	return out
}

// unescapeOctal undoes mountinfo's \ooo escapes (of spaces, tabs, \ and
// newlines).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ask sends req to the control socket of the mount at mnt and returns the
// answer, after checking that the socket's owner is the mount's (or
// root): anyone can bind an abstract name first, and a password must go
// to the mount only.
func ask(mnt string, owner uint32, req controlRequest) (controlReply, error) {
	var rep controlReply
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: controlName(mnt), Net: "unix"})
	if err != nil {
		return rep, fmt.Errorf("the mount at %s takes no logins (mounted without -o multiuser?): %v", mnt, err)
	}
	defer conn.Close()
	cred, err := peerCred(conn)
	if err != nil {
		return rep, err
	}
	if cred.Uid != owner && cred.Uid != 0 {
		return rep, fmt.Errorf("the control socket of %s belongs to uid %d, not to the mount's owner (uid %d): not sending credentials", mnt, cred.Uid, owner)
	}
	conn.SetDeadline(time.Now().Add(connectTimeout + 10*time.Second))
	b, err := json.Marshal(req)
	if err != nil {
		return rep, err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return rep, err
	}
	line, err := bufio.NewReader(io.LimitReader(conn, maxControlLine)).ReadBytes('\n')
	if err != nil {
		return rep, fmt.Errorf("no answer from the mount at %s: %v", mnt, err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("malformed answer from the mount at %s: %v", mnt, err)
	}
	return rep, nil
}
