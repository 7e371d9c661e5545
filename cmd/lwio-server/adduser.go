package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/lwiofs/lwiofs/smbauth"
)

// readPassword takes the password from LWIO_PASSWORD, else the first line
// of stdin (as smbpasswd -s does), never from the command line.
func readPassword(stdin io.Reader) (string, error) {
	if p, ok := os.LookupEnv("LWIO_PASSWORD"); ok {
		if p == "" {
			return "", errors.New("LWIO_PASSWORD is empty")
		}
		return p, nil
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", errors.New("no password: set LWIO_PASSWORD or give it on stdin")
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty password")
	}
	return line, nil
}

var sectionRe = regexp.MustCompile(`^\s*\[\s*([^\]]*?)\s*\]\s*(#.*)?$`)
var ntHashRe = regexp.MustCompile(`^\s*nt_hash\s*=`)

// setUserHash returns the TOML text with users.NAME.nt_hash set to hash,
// editing in place so comments and layout survive (as smbpasswd edits
// its database rather than rewriting it).
func setUserHash(text, name, hash string) string {
	lines := strings.Split(text, "\n")
	want := map[string]bool{"users." + name: true, `users."` + name + `"`: true}
	line := fmt.Sprintf("nt_hash = %q", hash)
	in := false
	for i, l := range lines {
		if m := sectionRe.FindStringSubmatch(l); m != nil {
			if in { // section ended without nt_hash: insert it
				return strings.Join(insert(lines, i, line), "\n")
			}
			in = want[strings.ReplaceAll(m[1], " ", "")]
			continue
		}
		if in && ntHashRe.MatchString(l) {
			lines[i] = line
			return strings.Join(lines, "\n")
		}
	}
	if in {
		// The section is last: put the line after its last non-blank line.
		j := len(lines)
		for j > 0 && strings.TrimSpace(lines[j-1]) == "" {
			j--
		}
		return strings.Join(insert(lines, j, line), "\n")
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text + fmt.Sprintf("\n[users.%s]\n%s\n", quoteKey(name), line)
}

func insert(lines []string, i int, s string) []string {
	out := append([]string{}, lines[:i]...)
	out = append(out, s)
	return append(out, lines[i:]...)
}

var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func quoteKey(k string) string {
	if bareKey.MatchString(k) {
		return k
	}
	return fmt.Sprintf("%q", k)
}

// addUser writes name's NT hash into the config file at path, creating the
// file if needed. The file is replaced atomically and kept mode 0600: it
// holds password equivalents.
func addUser(path, name string, stdin io.Reader) error {
	if name == "" || strings.ContainsAny(name, "\n\r\"") {
		return fmt.Errorf("bad user name %q", name)
	}
	pw, err := readPassword(stdin)
	if err != nil {
		return err
	}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	text := setUserHash(string(old), name, smbauth.FormatNTHash(smbauth.NTHash(pw)))
	tmp, err := os.CreateTemp(filepath.Dir(path), ".lwio-config-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Check the result parses and has the user before replacing the file.
	c, err := loadConfig(tmp.Name())
	if err != nil {
		return fmt.Errorf("refusing to write: %v", err)
	}
	if _, ok := c.Users[name]; !ok {
		return errors.New("refusing to write: user did not land in [users]")
	}
	return os.Rename(tmp.Name(), path)
}
