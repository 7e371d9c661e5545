// Package hostile runs hostile clients against a real lwiofs server (the
// session channel and the LWIO engine on softrdma, started in-process on
// 127.0.0.1 by package rig the way cmd/lwio-server wires them) and checks,
// after every case, that a legitimate client still gets a full round trip:
// session setup, LWIO AUTH, REGISTER, WRITE, READ and the same bytes back.
//
// The tests print their figures (attempts, refusals, timings); run
//
//	go test -race -v ./test/hostile
//
// to see them. docs/faults.md describes every case.
package hostile
