package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The pipe carrier: two FIFOs in a directory serve makes, "req" (pinger to
// server) and "resp" (back), each opened for one direction only, so each
// process's poller watches only the end it uses. One pinger at a time.

// servePipe makes the FIFOs, prints the directory and echoes each pinger
// in turn until ctx ends.
func servePipe(ctx context.Context, ready func(addr string)) error {
	dir, err := os.MkdirTemp("", "lwiofs-latency-pipe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, n := range []string{"req", "resp"} {
		if err := unix.Mkfifo(filepath.Join(dir, n), 0o600); err != nil {
			return err
		}
	}
	// The read end first: a pinger's open for writing needs a reader.
	req, err := openFIFO(filepath.Join(dir, "req"), unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer req.Close()
	ready(dir)
	for ctx.Err() == nil {
		// A pinger opens req, then resp for reading: once resp opens for
		// writing, it is there.
		resp, err := openFIFO(filepath.Join(dir, "resp"), unix.O_WRONLY)
		if errors.Is(err, unix.ENXIO) {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		// One byte tells the pinger the answers' writer is there: until
		// then its reads of resp see end of file.
		if _, err := resp.Write([]byte{1}); err == nil {
			echoStream(req, resp)
		}
		resp.Close()
	}
	return ctx.Err()
}

// dialPipe opens the pinger's ends of serve's FIFOs in dir.
func dialPipe(dir string) (r, w *os.File, err error) {
	w, err = openFIFO(filepath.Join(dir, "req"), unix.O_WRONLY)
	if err != nil {
		return nil, nil, err
	}
	r, err = openFIFO(filepath.Join(dir, "resp"), unix.O_RDONLY)
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	var b [1]byte
	for end := time.Now().Add(10 * time.Second); ; {
		n, err := r.Read(b[:])
		if n == 1 {
			return r, w, nil
		}
		if !errors.Is(err, io.EOF) || time.Now().After(end) {
			r.Close()
			w.Close()
			return nil, nil, fmt.Errorf("%s: the server never opened resp: %v", dir, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// openFIFO opens a FIFO non-blocking, so the runtime's poller waits for
// it (os.NewFile of a non-blocking descriptor).
func openFIFO(path string, mode int) (*os.File, error) {
	fd, err := unix.Open(path, mode|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
