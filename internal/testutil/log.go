package testutil

import (
	"os"

	"github.com/sirupsen/logrus"
)

// Logger returns a logger for a component of a test's setup (a server, a
// client, a provider): nil, which the configs take as quiet, unless
// LWIO_TEST_LOG is set; then debug level on stderr, each entry with the
// component's name.
func Logger(component string) logrus.FieldLogger {
	if os.Getenv("LWIO_TEST_LOG") == "" {
		return nil
	}
	l := logrus.New()
	l.SetLevel(logrus.DebugLevel)
	return l.WithField("component", component)
}
