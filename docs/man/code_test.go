package man

// What the programs accept, read from their source with go/ast: the man
// page test compares it with the pages. Each reader below names the code
// shape it understands; code written in another shape makes it find
// nothing or fail loudly, never pass quietly (the tests check that every
// set is non-empty).

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the module root, two levels above this package.
const repoRoot = "../.."

// goPackage is the parsed non-test files of one directory.
type goPackage struct {
	dir   string
	files []*ast.File
}

func parsePackage(t *testing.T, dir string) *goPackage {
	t.Helper()
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.go"))
	if err != nil || len(matches) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	p := &goPackage{dir: dir}
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		p.files = append(p.files, f)
	}
	return p
}

// inspect walks every file of the package.
func (p *goPackage) inspect(fn func(ast.Node) bool) {
	for _, f := range p.files {
		ast.Inspect(f, fn)
	}
}

// funcDecl finds a function or method by name.
func (p *goPackage) funcDecl(name string) *ast.FuncDecl {
	for _, f := range p.files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == name {
				return fd
			}
		}
	}
	return nil
}

// packageVar finds the value of a package-level var by name.
func (p *goPackage) packageVar(name string) ast.Expr {
	for _, f := range p.files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name == name && i < len(vs.Values) {
						return vs.Values[i]
					}
				}
			}
		}
	}
	return nil
}

func strLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

func isSel(e ast.Expr, pkg, name string) bool {
	se, ok := e.(*ast.SelectorExpr)
	return ok && isIdent(se.X, pkg) && se.Sel.Name == name
}

// isFirstArg reports whether e is a program's first argument: args[0]
// (the slice after the program name, as every main here passes it on) or
// os.Args[1].
func isFirstArg(e ast.Expr) bool {
	ix, ok := e.(*ast.IndexExpr)
	if !ok {
		return false
	}
	lit, ok := ix.Index.(*ast.BasicLit)
	return ok && (isIdent(ix.X, "args") && lit.Value == "0" || isSel(ix.X, "os", "Args") && lit.Value == "1")
}

// comparedLiterals calls fn for every string literal compared with == to
// another expression (either side), as a case of a switch on an
// expression, or given as the prefix to strings.HasPrefix (then with
// prefix set).
func comparedLiterals(n ast.Node, fn func(other ast.Expr, lit string, prefix bool)) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			if n.Op != token.EQL {
				break
			}
			if s, ok := strLit(n.Y); ok {
				fn(n.X, s, false)
			} else if s, ok := strLit(n.X); ok {
				fn(n.Y, s, false)
			}
		case *ast.SwitchStmt:
			if n.Tag == nil {
				break
			}
			for _, s := range caseStrings(n) {
				fn(n.Tag, s, false)
			}
		case *ast.CallExpr:
			if isSel(n.Fun, "strings", "HasPrefix") && len(n.Args) == 2 {
				if s, ok := strLit(n.Args[1]); ok {
					fn(n.Args[0], s, true)
				}
			}
		}
		return true
	})
}

var flagRe = regexp.MustCompile(`^--?[A-Za-z][A-Za-z0-9-]*$`)

// flagDefiners are the flag.FlagSet methods that define a flag, with the
// index of the name argument.
var flagDefiners = map[string]int{
	"Bool": 0, "BoolVar": 1, "BoolFunc": 0, "Duration": 0, "DurationVar": 1, "Float64": 0,
	"Float64Var": 1, "Func": 0, "Int": 0, "IntVar": 1, "Int64": 0, "Int64Var": 1, "String": 0,
	"StringVar": 1, "TextVar": 1, "Uint": 0, "UintVar": 1, "Uint64": 0, "Uint64Var": 1, "Var": 1,
}

// commandLine is what one program package accepts on its command line.
type commandLine struct {
	flags       map[string]bool // with their dash: "-config", "--help"
	subcommands map[string]bool // "adduser", "providers"
}

// readCommandLine collects a package's flags and subcommands:
//   - every flag defined on a flag.FlagSet made by flag.NewFlagSet in the
//     same function (or on package flag's own set), written "-name", plus
//     -h and -help, which package flag always accepts;
//   - every string literal that looks like a flag ("-x", "--xy") and is
//     compared with ==, switched on or given to strings.HasPrefix, which
//     is how a hand-written parser (mountcmd's parseArgs) matches flags;
//   - as subcommands, every other literal compared with the first argument
//     (args[0] or os.Args[1]).
func readCommandLine(t *testing.T, p *goPackage) commandLine {
	t.Helper()
	cl := commandLine{flags: map[string]bool{}, subcommands: map[string]bool{}}
	usesFlagPkg := false
	for _, f := range p.files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			sets := map[string]bool{"flag": true}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
					if call, ok := as.Rhs[0].(*ast.CallExpr); ok && isSel(call.Fun, "flag", "NewFlagSet") {
						if id, ok := as.Lhs[0].(*ast.Ident); ok {
							sets[id.Name] = true
						}
					}
				}
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				se, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := se.X.(*ast.Ident)
				at, defines := flagDefiners[se.Sel.Name]
				if !ok || !sets[id.Name] || !defines || at >= len(call.Args) {
					return true
				}
				name, ok := strLit(call.Args[at])
				if !ok {
					t.Errorf("%s: %s.%s defines a flag whose name is not a string literal; the man page test cannot read it", p.dir, id.Name, se.Sel.Name)
					return true
				}
				cl.flags["-"+name] = true
				usesFlagPkg = true
				return true
			})
		}
	}
	if usesFlagPkg {
		cl.flags["-h"], cl.flags["-help"] = true, true
	}
	for _, f := range p.files {
		comparedLiterals(f, func(other ast.Expr, lit string, _ bool) {
			switch {
			case flagRe.MatchString(lit):
				cl.flags[lit] = true
			case isFirstArg(other) && lit != "" && !strings.HasPrefix(lit, "-"):
				cl.subcommands[lit] = true
			}
		})
	}
	return cl
}

// mustFunc finds the function named fn or fails the test.
func (p *goPackage) mustFunc(t *testing.T, fn string) *ast.FuncDecl {
	t.Helper()
	fd := p.funcDecl(fn)
	if fd == nil {
		t.Fatalf("%s: no function %s", p.dir, fn)
	}
	return fd
}

// firstSwitch is the first expression switch in n, in source order, with
// the string literals of its cases; nil if there is none.
func firstSwitch(n ast.Node) (*ast.SwitchStmt, map[string]bool) {
	var sw *ast.SwitchStmt
	ast.Inspect(n, func(n ast.Node) bool {
		if s, ok := n.(*ast.SwitchStmt); ok && sw == nil && s.Tag != nil {
			sw = s
		}
		return sw == nil
	})
	cases := map[string]bool{}
	if sw != nil {
		for _, s := range caseStrings(sw) {
			cases[s] = true
		}
	}
	return sw, cases
}

// caseStrings lists the string literals among a switch's cases.
func caseStrings(sw *ast.SwitchStmt) []string {
	var out []string
	for _, st := range sw.Body.List {
		for _, e := range st.(*ast.CaseClause).List {
			if s, ok := strLit(e); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// readMountOptions collects the -o options the function named fn accepts
// (mountcmd's applyOption): the cases of its first switch, whose tag is
// the option's key; other literals compared with that key (key ==
// "comment"); prefixes it is tested for (strings.HasPrefix(key, "x-"),
// written "x-*"); and the keys of any package-level map indexed by it
// (ignoredOptions[key]).
func readMountOptions(t *testing.T, p *goPackage, fn string) map[string]bool {
	t.Helper()
	fd := p.mustFunc(t, fn)
	sw, out := firstSwitch(fd.Body)
	var keyID *ast.Ident
	if sw != nil {
		keyID, _ = sw.Tag.(*ast.Ident)
	}
	if keyID == nil {
		t.Fatalf("%s: %s has no switch on the option key", p.dir, fn)
	}
	key := keyID.Name
	comparedLiterals(fd.Body, func(other ast.Expr, lit string, prefix bool) {
		if !isIdent(other, key) {
			return
		}
		if prefix {
			lit += "*"
		}
		out[lit] = true
	})
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		ix, ok := n.(*ast.IndexExpr)
		if !ok || !isIdent(ix.Index, key) {
			return true
		}
		m, ok := ix.X.(*ast.Ident)
		if !ok {
			return true
		}
		cl, ok := p.packageVar(m.Name).(*ast.CompositeLit)
		if !ok {
			t.Errorf("%s: %s[%s] is not a package-level map literal", p.dir, m.Name, key)
			return true
		}
		for _, e := range cl.Elts {
			if s, ok := strLit(e.(*ast.KeyValueExpr).Key); ok {
				out[s] = true
			}
		}
		return true
	})
	return out
}

// readFirstSwitch collects the string cases of the first switch in the
// function named fn (mountcmd's readCredentials: the credentials-file
// keys).
func readFirstSwitch(t *testing.T, p *goPackage, fn string) map[string]bool {
	t.Helper()
	_, cases := firstSwitch(p.mustFunc(t, fn).Body)
	return cases
}

// readTOMLKeys lists the keys of the TOML struct named root, dotted by
// table: a field of struct type is a table ("log.level"), a map of structs
// a table per name ("shares.NAME.path"). Every exported field must carry a
// toml tag, so that the name a user writes is the one read here.
func readTOMLKeys(t *testing.T, p *goPackage, root string) map[string]bool {
	t.Helper()
	structs := map[string]*ast.StructType{}
	for _, f := range p.files {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st
				}
			}
			return true
		})
	}
	out := map[string]bool{}
	var walk func(st *ast.StructType, prefix string)
	walk = func(st *ast.StructType, prefix string) {
		for _, fl := range st.Fields.List {
			for _, n := range fl.Names {
				if !n.IsExported() {
					continue
				}
				var tag string
				if fl.Tag != nil {
					raw, _ := strconv.Unquote(fl.Tag.Value)
					tag, _, _ = strings.Cut(reflect.StructTag(raw).Get("toml"), ",")
				}
				if tag == "-" {
					continue
				}
				if tag == "" {
					t.Errorf("%s: field %s of a TOML struct has no toml tag", p.dir, n.Name)
					continue
				}
				typ := fl.Type
				if se, ok := typ.(*ast.StarExpr); ok {
					typ = se.X
				}
				switch ft := typ.(type) {
				case *ast.Ident:
					if sub, ok := structs[ft.Name]; ok {
						walk(sub, prefix+tag+".")
						continue
					}
				case *ast.MapType:
					if id, ok := ft.Value.(*ast.Ident); ok && structs[id.Name] != nil {
						walk(structs[id.Name], prefix+tag+".NAME.")
						continue
					}
				}
				out[prefix+tag] = true
			}
		}
	}
	st := structs[root]
	if st == nil {
		t.Fatalf("%s: no struct %s", p.dir, root)
	}
	walk(st, "")
	return out
}

// readStringSlice reads a package-level []string literal.
func readStringSlice(t *testing.T, p *goPackage, name string) []string {
	t.Helper()
	cl, ok := p.packageVar(name).(*ast.CompositeLit)
	if !ok {
		t.Fatalf("%s: %s is not a package-level slice literal", p.dir, name)
	}
	var out []string
	for _, e := range cl.Elts {
		s, ok := strLit(e)
		if !ok {
			t.Fatalf("%s: %s holds a non-literal", p.dir, name)
		}
		out = append(out, s)
	}
	return out
}

// mainPackages lists the program directories under cmd/ (cmd/internal
// holds libraries).
func mainPackages(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(repoRoot, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != "internal" {
			out = append(out, "cmd/"+e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// callsInMain reports whether func main calls pkg.name.
func callsInMain(p *goPackage, pkg, name string) bool {
	fd := p.funcDecl("main")
	found := false
	if fd != nil {
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && isSel(call.Fun, pkg, name) {
				found = true
			}
			return !found
		})
	}
	return found
}
