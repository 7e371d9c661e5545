package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMainThreadRunsOnlyMain: no goroutine but main's runs on the
// process's main thread, so no request's disk operation blocks there. The
// kernel gives a SIGTERM sent to the process to its main thread first;
// one blocked in a disk that lets only a fatal signal end its wait (a
// hard NFS mount) keeps the SIGTERM pending, and the server would never
// begin its shutdown.
func TestMainThreadRunsOnlyMain(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	const n = 64
	tids := make(chan int, n)
	done := make(chan struct{}, n)
	for range n {
		go func() {
			defer func() { done <- struct{}{} }()
			tids <- unix.Gettid()
			var b [1]byte
			unix.Read(fds[0], b[:]) // blocks its thread, as a disk that does not answer
		}()
	}
	onMain := 0
	for range n {
		if <-tids == os.Getpid() {
			onMain++
		}
	}
	unix.Close(fds[1])
	for range n {
		<-done
	}
	if onMain > 0 {
		t.Errorf("%d of %d goroutines ran on the main thread", onMain, n)
	}
}
