// Package defaults fills a config's unset fields: the one rule the
// protocol configs share, that zero or less means the default.
package defaults

// Set sets *v to d when *v is zero or negative (a count, a size or a
// time.Duration left unset).
func Set[T ~int | ~int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
