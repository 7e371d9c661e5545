package cli

import (
	"fmt"
	"os"
	"runtime/trace"
	"strings"
	"time"
)

// TraceEnv names the hidden debugging switch that records an execution
// trace (runtime/trace, for `go tool trace`): LWIO_TRACE=FILE[,DELAY[,FOR]]
// starts recording DELAY after the program starts (default 0) and writes
// FILE after FOR (default 5s). It is how a request's time is split between
// goroutines, syscalls and wake-ups (docs/bench.md, "Where a 4K read's time
// goes"); a program without the variable does nothing.
const TraceEnv = "LWIO_TRACE"

// TraceFromEnv starts the recording TraceEnv asks for, in the background;
// problems go to stderr prefixed with prog, and never stop the program.
func TraceFromEnv(prog string) {
	spec := os.Getenv(TraceEnv)
	if spec == "" {
		return
	}
	file, delay, span, err := parseTraceSpec(spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s: %v\n", prog, TraceEnv, err)
		return
	}
	go func() {
		time.Sleep(delay)
		f, err := os.Create(file)
		if err == nil {
			err = trace.Start(f)
			if err == nil {
				time.Sleep(span)
				trace.Stop()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %s: %v\n", prog, TraceEnv, err)
		}
	}()
}

// parseTraceSpec reads FILE[,DELAY[,FOR]].
func parseTraceSpec(spec string) (file string, delay, span time.Duration, err error) {
	parts := strings.Split(spec, ",")
	if len(parts) > 3 || parts[0] == "" {
		return "", 0, 0, fmt.Errorf("%q is not FILE[,DELAY[,FOR]]", spec)
	}
	file, span = parts[0], 5*time.Second
	if len(parts) > 1 {
		if delay, err = time.ParseDuration(parts[1]); err != nil {
			return "", 0, 0, err
		}
	}
	if len(parts) > 2 {
		if span, err = time.ParseDuration(parts[2]); err != nil {
			return "", 0, 0, err
		}
	}
	if delay < 0 || span <= 0 {
		return "", 0, 0, fmt.Errorf("%q: DELAY must be ≥ 0 and FOR > 0", spec)
	}
	return file, delay, span, nil
}
