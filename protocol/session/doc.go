// Package session is the session channel of lwiofs: the SMB-like side of
// LWIO (seed 001, FIG. 2) on which a client authenticates once with NTLMv2,
// connects to shares, does every namespace operation, opens files and gets
// their server resume keys (FIG. 3), and runs the LWIO negotiate over the
// named pipe \PIPE\LWIO (FIG. 4A/4B) before opening RDMA connections.
//
// The client side is Dial → *Client → TreeConnect → *Tree, safe for
// concurrent use: requests are multiplexed on one TCP connection by message
// id. The server side is NewServer → (*Server).Serve; it also answers the
// LWIO engine's questions (SessionByKey, OpenByResumeKey: it is the
// engine's server.Authority).
//
// Every frame after session setup is signed with HMAC-SHA256 under the NTLM
// session key, or sealed with AES-GCM under keys derived from it (seal.go:
// server-wide and per-share encrypt settings, the client's SealMode);
// replayed ids, bad signatures, bad or out-of-sequence sealed frames and
// malformed frames end the connection. The server does no file I/O itself:
// each tree connect is a protocol/share Tree, which resolves every path
// beneath its share root and does the disk operation. Errors travel as
// NTSTATUS and come back as errno through one table (protocol/ntstatus;
// ToErrno here is the same function); a call whose connection died returns
// a *protocol.ConnectionError. docs/session.md has the frame layout, the
// commands, the error table and the confinement rules.
package session
