package mountcmd

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"

	"golang.org/x/term"

	"github.com/lwiofs/lwiofs/cmd/internal/ctl"
)

// runLogin is `lwio login` and `lwio logout`: a local user adds their own
// credentials to a running multiuser mount, or drops them, through the
// mount's control endpoint (control.go, cmd/internal/ctl).
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
	m, err := findMount(fl.Arg(0))
	if err != nil {
		return fail(err)
	}
	var req any
	if op == "login" {
		c, err := loginCredentials(*credFile, *userName, getenv(passwordEnv), stdin, stderr)
		if err != nil {
			return fail(err)
		}
		req = loginArgs{Username: c.username, Domain: c.domain, Password: c.password}
	}
	var msg string
	if err := ctl.Call(m.Socket(), m.Owner, op, req, &msg); err != nil {
		return fail(fmt.Errorf("%s: %w", m.Point, err))
	}
	fmt.Fprintf(stdout, "%s: %s\n", m.Point, msg)
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

// findMount finds the lwio mount named by arg: its source
// (//HOST[:PORT]/SHARE, which must name exactly one mount) or its
// mountpoint.
func findMount(arg string) (ctl.Mount, error) {
	if !strings.HasPrefix(arg, "//") && !strings.HasPrefix(arg, `\\`) {
		return ctl.Find(arg)
	}
	host, port, share, err := parseSource(arg)
	if err != nil {
		return ctl.Mount{}, err
	}
	want := (&Options{Host: host, Port: port, Share: share}).Source()
	mounts, err := ctl.Mounts()
	if err != nil {
		return ctl.Mount{}, err
	}
	var found []ctl.Mount
	for _, m := range mounts {
		if strings.EqualFold(m.Source, want) {
			found = append(found, m)
		}
	}
	switch len(found) {
	case 0:
		return ctl.Mount{}, fmt.Errorf("no lwio mount of %s here", want)
	case 1:
		return found[0], nil
	}
	var dirs []string
	for _, m := range found {
		dirs = append(dirs, m.Point)
	}
	return ctl.Mount{}, fmt.Errorf("%s is mounted at %s: name the mountpoint", want, strings.Join(dirs, ", "))
}
