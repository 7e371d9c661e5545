package mountcmd

import (
	"context"
	"errors"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol/session"
)

// openLWIO connects the LWIO client engine. Until protocol/client lands it
// reports that the engine is missing, and the mount falls back.
func openLWIO(ctx context.Context, o *Options, c *session.Client, tree *session.Tree, log *logrus.Logger) (*dataPath, error) {
	_ = localProviders
	return nil, errors.New("LWIO client engine not built in")
}
