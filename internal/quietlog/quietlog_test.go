package quietlog

import (
	"bytes"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestOr: a logger handed in is used as it is; none gives one that writes
// nothing.
func TestOr(t *testing.T) {
	var buf bytes.Buffer
	l := logrus.New()
	l.Out = &buf
	if got := Or(l); got != l {
		t.Fatalf("Or(l) = %v, want l itself", got)
	}
	q, ok := Or(nil).(*logrus.Logger)
	if !ok {
		t.Fatalf("Or(nil) is a %T", Or(nil))
	}
	var out bytes.Buffer
	q.Out = &out // where it would write, were it to
	q.WithField("k", "v").Error("dropped")
	q.Warn("dropped")
	if out.Len() != 0 {
		t.Fatalf("Or(nil) wrote %q", out.String())
	}
}
