// Package man holds the man pages' sources, lwio-server.8.md,
// lwio-mount.8.md and lwio.toml.5.md, in go-md2man's Markdown (`make man`
// renders them to roff with `go tool go-md2man`), and the test that keeps
// them in step with the code: every flag, subcommand, mount option,
// credentials-file key and configuration key a program accepts must have
// an entry in its page, and every entry must be something a program
// accepts. The program side is read from the code itself (flag sets, the
// mount option parser, the TOML configuration struct), so an option added
// without a man entry fails `make test`. There is no Go API here.
package man
