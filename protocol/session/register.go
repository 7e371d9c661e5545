package session

import "fmt"

// register names command c and its request and response bodies. Commands
// of the second round (numbers 29–47, WAVE2) register themselves from the
// init of their own file (mknod.go, idmap.go, …), so that no two features
// edit one table; a number taken twice is a programming error.
func register(c Command, name string, req, resp func() message) {
	if c >= cmdLimit || commandNames[c] != "" || bodies[c].req != nil {
		panic(fmt.Sprintf("session: command %d (%s) registered twice or out of range", c, name))
	}
	commandNames[c] = name
	bodies[c].req, bodies[c].resp = req, resp
}
