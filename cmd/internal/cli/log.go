// Package cli holds what the programs share: logging set-up, the one-line
// fatal error and -version.
package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sirupsen/logrus"
)

// NewLogger returns a logger writing to w at level ("debug", "info",
// "warn", "error") in format ("text" or "json").
func NewLogger(w io.Writer, level, format string) (*logrus.Logger, error) {
	l := logrus.New()
	l.Out = w
	if level == "" {
		level = "info"
	}
	lv, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	l.SetLevel(lv)
	switch strings.ToLower(format) {
	case "", "text":
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		l.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	return l, nil
}

// Fatal prints "prog: message" on stderr as one line and exits with code.
func Fatal(prog string, code int, err error) {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	fmt.Fprintf(os.Stderr, "%s: %s\n", prog, msg)
	os.Exit(code)
}
