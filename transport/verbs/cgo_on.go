//go:build cgo

package verbs

const cgoEnabled = true
