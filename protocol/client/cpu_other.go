//go:build !linux

package client

// currentCPU is 0 where getcpu(2) is not available: ties go to the first
// connection.
func currentCPU() int { return 0 }
