package soft

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// EnvFaults is the environment variable end-to-end tests use to hand a
// fault specification (see ParseFaults) to the binaries they start.
const EnvFaults = "LWIO_SOFT_FAULTS"

// Faults injects failures into a provider's connections, deterministically,
// so tests of reconnects and timeouts do not depend on timing luck.
//
// An operation is one request a connection carries: a SEND or RDMA WRITE
// it transmits, or one it receives from the peer (acknowledgements do not
// count). A connection with ResetAfterOps N carries exactly N operations:
// when it would carry the N+1-th it is reset instead.
type Faults struct {
	// ResetAfterOps resets the TCP connection (RST; a unix socket is
	// closed) instead of carrying its N+1-th operation; both ends flush
	// all outstanding work. Zero means never.
	ResetAfterOps int
	// DropAfterOps turns the connection into a black hole instead of
	// carrying its N+1-th operation: nothing more is sent, received data
	// is discarded, the socket stays open, so both ends see silence until
	// their TransportTimeout fails them with StatusTransportError. Zero
	// means never.
	DropAfterOps int
	// DelayCompletions holds every completion this long before the CQ
	// reports it (order is kept). Zero means no delay.
	DelayCompletions time.Duration
	// Conns limits the faults to the first Conns connections the provider
	// makes (dialled or accepted), so a test can fault one connection and
	// watch the reconnect succeed. Zero means every connection.
	Conns int
}

// ParseFaults parses a comma-separated list of key=value pairs:
//
//	reset_after=N  ResetAfterOps
//	drop_after=N   DropAfterOps
//	delay=D        DelayCompletions (a time.ParseDuration string, e.g. 1ms)
//	conns=N        Conns
//
// e.g. "reset_after=100,delay=1ms". An empty (or blank) string is no
// faults: nil, nil.
func ParseFaults(s string) (*Faults, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var f Faults
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("softrdma faults: %q is not key=value", kv)
		}
		var err error
		switch k {
		case "reset_after":
			f.ResetAfterOps, err = parseCount(v)
		case "drop_after":
			f.DropAfterOps, err = parseCount(v)
		case "conns":
			f.Conns, err = parseCount(v)
		case "delay":
			f.DelayCompletions, err = time.ParseDuration(v)
			if err == nil && f.DelayCompletions < 0 {
				err = fmt.Errorf("negative")
			}
		default:
			return nil, fmt.Errorf("softrdma faults: unknown key %q (want reset_after, drop_after, delay, conns)", k)
		}
		if err != nil {
			return nil, fmt.Errorf("softrdma faults: %s=%q: %v", k, v, err)
		}
	}
	return &f, nil
}

func parseCount(v string) (int, error) {
	n, err := strconv.ParseUint(v, 10, 31)
	return int(n), err
}

// String formats f in ParseFaults' syntax.
func (f *Faults) String() string {
	if f == nil {
		return ""
	}
	var parts []string
	if f.ResetAfterOps > 0 {
		parts = append(parts, "reset_after="+strconv.Itoa(f.ResetAfterOps))
	}
	if f.DropAfterOps > 0 {
		parts = append(parts, "drop_after="+strconv.Itoa(f.DropAfterOps))
	}
	if f.DelayCompletions > 0 {
		parts = append(parts, "delay="+f.DelayCompletions.String())
	}
	if f.Conns > 0 {
		parts = append(parts, "conns="+strconv.Itoa(f.Conns))
	}
	return strings.Join(parts, ",")
}

// FaultsFromEnv parses the EnvFaults variable; unset or empty is nil.
func FaultsFromEnv() (*Faults, error) { return ParseFaults(os.Getenv(EnvFaults)) }
