//go:build verbsbroken

package verbs

// brokenRKey: this build deliberately corrupts the rkey of every RDMA WRITE
// (see broken_off.go). Tests only.
const brokenRKey = true
