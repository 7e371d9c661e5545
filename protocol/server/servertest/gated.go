package servertest

import (
	"sync"

	"github.com/lwiofs/lwiofs/protocol/share"
)

// GatedFile is a share.File whose reads and writes wait until Open, so
// that a test can hold requests executing (or, behind them, queued) on
// the server. Entered receives once for each read or write as it starts
// to wait (up to 1024 unread).
type GatedFile struct {
	share.File
	Entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

// NewGatedFile returns f gated, closed until Open.
func NewGatedFile(f share.File) *GatedFile {
	return &GatedFile{File: f, Entered: make(chan struct{}, 1024), gate: make(chan struct{})}
}

// Open lets every read and write through, those waiting and those to
// come. Calling it again does nothing.
func (g *GatedFile) Open() { g.once.Do(func() { close(g.gate) }) }

func (g *GatedFile) wait() {
	g.Entered <- struct{}{}
	<-g.gate
}

// ReadAt is f's, once the gate is open.
func (g *GatedFile) ReadAt(p []byte, off int64) (int, error) {
	g.wait()
	return g.File.ReadAt(p, off)
}

// WriteAt is f's, once the gate is open.
func (g *GatedFile) WriteAt(p []byte, off int64) (int, error) {
	g.wait()
	return g.File.WriteAt(p, off)
}
