package testutil

import "os/exec"

// Interruptible is exec.Command(name, args...) for a program a test stops
// with SIGINT, as Ctrl-C would: it runs with SIGINT at its default action.
// A test binary started in the background by a non-interactive shell
// (`go test … &`, nohup, some CI runners) has SIGINT ignored, and every
// program it starts inherits that: its SIGINT would do nothing, and the
// program would run on (coreutils env --default-signal, 8.31 or later).
func Interruptible(name string, args ...string) *exec.Cmd {
	return exec.Command("env", append([]string{"--default-signal=INT", name}, args...)...)
}
