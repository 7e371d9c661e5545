// Package enum is the String method the small enums share: a table of
// names by value, and the type's name for a value with none.
package enum

import "fmt"

// Name returns names[v], or "typ(v)" (e.g. "Mode(7)") when v has no name
// there: the String of an enum whose names are listed by value, as in
//
//	var modeNames = [...]string{Interrupt: "interrupt", Polling: "polling"}
//	func (m Mode) String() string { return enum.Name(modeNames[:], m, "Mode") }
func Name[T ~int | ~int32 | ~uint8 | ~uint16](names []string, v T, typ string) string {
	if v >= 0 && int64(v) < int64(len(names)) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}
