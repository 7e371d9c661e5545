//go:build !verbsbroken

package verbs

// brokenRKey is set only by the verbsbroken build tag, which exists to prove
// that the conformance suite catches a provider that names remote memory
// wrongly (docs/verbs.md). Never set in a real build.
const brokenRKey = false
