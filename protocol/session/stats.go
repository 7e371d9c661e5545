package session

// Sessions is the number of sessions logged on now, for the server's
// metrics (protocol/fileserver).
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}
