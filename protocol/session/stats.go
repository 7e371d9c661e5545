package session

import (
	"maps"
	"time"
)

// Sessions is the number of sessions logged on now, for the server's
// metrics (protocol/fileserver).
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Stats is what the session server reports of its users, for the server's
// metrics (protocol/fileserver publishes it at /metrics): who holds how
// many handles against the limits, and how the logon throttle is doing.
type Stats struct {
	// Handles is the open handles by user (lower-cased logon name), over
	// all its sessions, durable opens kept for a reconnect included:
	// what max_open_files_per_user bounds. HandlesTotal is their sum,
	// bounded by max_open_files.
	Handles      map[string]int
	HandlesTotal int
	// LogonFailures counts AUTHENTICATEs refused for a wrong user name or
	// password (each is one "logon failure" log line).
	LogonFailures uint64
	// LogonsThrottled counts AUTHENTICATEs the throttle held back, and
	// ThrottleWait the time it held them in all.
	LogonsThrottled uint64
	ThrottleWait    time.Duration
}

// Stats returns the server's figures now.
func (s *Server) Stats() Stats {
	s.handles.mu.Lock()
	h, total := maps.Clone(s.handles.perUser), s.handles.total
	s.handles.mu.Unlock()
	return Stats{
		Handles:         h,
		HandlesTotal:    total,
		LogonFailures:   s.logonFailures.Load(),
		LogonsThrottled: s.logonsThrottled.Load(),
		ThrottleWait:    time.Duration(s.throttleWait.Load()),
	}
}
