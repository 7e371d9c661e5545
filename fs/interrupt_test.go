package fs

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol"
)

// cancelCounter is a DataFile that only counts LWIO CANCELs.
type cancelCounter struct {
	DataFile
	n atomic.Int32
}

func (c *cancelCounter) Cancel(context.Context) error { c.n.Add(1); return nil }

func TestRunInterrupt(t *testing.T) {
	newHandle := func() (*fileHandle, *cancelCounter) {
		cc := &cancelCounter{}
		f := &fileHandle{log: Options{}.logger(), watch: &watchList{}}
		f.data.Store(&dataBox{cc})
		return f, cc
	}

	// Interrupted, but done within the grace: success, no CANCEL.
	f, cc := newHandle()
	ctx, interrupt := context.WithCancel(context.Background())
	n, err := f.run(ctx, func(ctx context.Context) (int, error) {
		interrupt()
		time.Sleep(50 * time.Millisecond)
		return 7, ctx.Err()
	})
	if n != 7 || err != nil {
		t.Errorf("quick interrupted request: %d %v, want 7 nil", n, err)
	}
	time.Sleep(20 * time.Millisecond)
	if cc.n.Load() != 0 {
		t.Errorf("quick interrupted request sent %d CANCELs", cc.n.Load())
	}

	// Interrupted and stuck: abandoned after the grace, one CANCEL.
	f, cc = newHandle()
	ctx, interrupt = context.WithCancel(context.Background())
	start := time.Now()
	_, err = f.run(ctx, func(ctx context.Context) (int, error) {
		interrupt()
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || time.Since(start) < interruptGrace {
		t.Errorf("stuck request: %v after %v; want context.Canceled after %v", err, time.Since(start), interruptGrace)
	}
	deadline := time.Now().Add(time.Second)
	for cc.n.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if cc.n.Load() != 1 {
		t.Errorf("stuck request sent %d CANCELs, want 1", cc.n.Load())
	}

	// A bystander cancelled by another request's CANCEL is retried.
	f, _ = newHandle()
	calls := 0
	n, err = f.run(context.Background(), func(ctx context.Context) (int, error) {
		calls++
		if calls == 1 {
			return 0, protocol.StatusCancelled
		}
		return 3, nil
	})
	if n != 3 || err != nil || calls != 2 {
		t.Errorf("bystander: %d %v after %d calls", n, err, calls)
	}
}
