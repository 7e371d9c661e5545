// Package quietlog gives the packages whose configs take a
// logrus.FieldLogger what "nil means quiet" calls for.
package quietlog

import (
	"io"

	"github.com/sirupsen/logrus"
)

// Or returns l, or, when l is nil, a logger that writes nothing. Its level
// is Panic, so that what it would drop is not formatted first.
func Or(l logrus.FieldLogger) logrus.FieldLogger {
	if l != nil {
		return l
	}
	q := logrus.New()
	q.Out = io.Discard
	q.Level = logrus.PanicLevel
	return q
}
