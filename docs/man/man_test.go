package man

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/russross/blackfriday/v2"
)

// page is one man page source: per top-level (#) section, the names its
// definition-list terms set in bold (an entry "**-listen** *ADDR*" names
// -listen; "**bg**, **background**" names both) and its code blocks.
type page struct {
	name  string
	terms map[string][]string
	code  map[string][]string
}

func readPage(t *testing.T, name string) *page {
	t.Helper()
	src, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	p := &page{name: name, terms: map[string][]string{}, code: map[string][]string{}}
	md := blackfriday.New(blackfriday.WithExtensions(md2man.NewRoffRenderer().GetExtensions()))
	section := ""
	md.Parse(src).Walk(func(n *blackfriday.Node, entering bool) blackfriday.WalkStatus {
		if !entering {
			return blackfriday.GoToNext
		}
		switch n.Type {
		case blackfriday.Heading:
			if n.Level == 1 && !n.IsTitleblock {
				section = plainText(n)
			}
		case blackfriday.CodeBlock:
			p.code[section] = append(p.code[section], string(n.Literal))
		case blackfriday.Item:
			if n.ListFlags&blackfriday.ListTypeTerm != 0 {
				n.Walk(func(s *blackfriday.Node, entering bool) blackfriday.WalkStatus {
					if entering && s.Type == blackfriday.Strong {
						p.terms[section] = append(p.terms[section], plainText(s))
						return blackfriday.SkipChildren
					}
					return blackfriday.GoToNext
				})
				return blackfriday.SkipChildren
			}
		}
		return blackfriday.GoToNext
	})
	return p
}

func plainText(n *blackfriday.Node) string {
	var b strings.Builder
	n.Walk(func(c *blackfriday.Node, entering bool) blackfriday.WalkStatus {
		if entering && (c.Type == blackfriday.Text || c.Type == blackfriday.Code) {
			b.Write(c.Literal)
		}
		return blackfriday.GoToNext
	})
	return b.String()
}

// termSet is the set of term names in the given sections (all when none).
func (p *page) termSet(t *testing.T, sections ...string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for s, names := range p.terms {
		if len(sections) > 0 && !contains(sections, s) {
			continue
		}
		for _, n := range names {
			out[n] = true
		}
	}
	for _, s := range sections {
		if len(p.terms[s]) == 0 {
			t.Errorf("%s: section %q has no entries (renamed?)", p.name, s)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sameSet reports, as test errors, what the code accepts that the page does
// not list and what the page lists that the code does not accept.
func sameSet(t *testing.T, what, pageName string, code, doc map[string]bool) {
	t.Helper()
	if len(code) == 0 {
		t.Errorf("%s: read nothing from the code; the reader no longer fits it", what)
	}
	for _, k := range sortedKeys(code) {
		if !doc[k] {
			t.Errorf("%s %q is accepted by the program but has no entry in %s", what, k, pageName)
		}
	}
	for _, k := range sortedKeys(doc) {
		if !code[k] {
			t.Errorf("%s %q has an entry in %s but the program does not accept it", what, k, pageName)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func union(sets ...map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, s := range sets {
		for k := range s {
			out[k] = true
		}
	}
	return out
}

// manPages maps every program under cmd/ to its page and the packages
// whose command line it documents. A new program needs a line here and a
// page: the test fails until it has both.
var manPages = map[string]struct {
	page     string
	packages []string
}{
	"cmd/lwio-server": {"lwio-server.8.md", []string{"cmd/lwio-server"}},
	"cmd/lwio-mount":  {"lwio-mount.8.md", []string{"cmd/lwio-mount", "cmd/internal/mountcmd"}},
	"cmd/lwio":        {"lwio-mount.8.md", []string{"cmd/lwio", "cmd/internal/mountcmd"}},
}

func versionFlags(t *testing.T) map[string]bool {
	out := map[string]bool{}
	for _, f := range readStringSlice(t, parsePackage(t, "cmd/internal/cli"), "VersionFlags") {
		out[f] = true
	}
	return out
}

// TestEveryProgramHasVersionAndPage: every program under cmd/ calls
// cli.HandleVersion first thing in main and has a man page.
func TestEveryProgramHasVersionAndPage(t *testing.T) {
	for _, dir := range mainPackages(t) {
		if !callsInMain(parsePackage(t, dir), "cli", "HandleVersion") {
			t.Errorf("%s: main does not call cli.HandleVersion (every program takes -version)", dir)
		}
		if _, ok := manPages[dir]; !ok {
			t.Errorf("%s has no man page: add one in docs/man and a line in manPages", dir)
		}
	}
}

// TestCommandLinesDocumented: flags and subcommands, both ways.
func TestCommandLinesDocumented(t *testing.T) {
	sections := map[string][]string{
		"lwio-server.8.md": {"OPTIONS", "COMMANDS"},
		"lwio-mount.8.md":  {"FLAGS", "COMMANDS"},
	}
	code := map[string]map[string]bool{}
	for _, prog := range sortedKeys(map[string]bool{"cmd/lwio-server": true, "cmd/lwio-mount": true, "cmd/lwio": true}) {
		mp := manPages[prog]
		set := versionFlags(t)
		for _, dir := range mp.packages {
			cl := readCommandLine(t, parsePackage(t, dir))
			set = union(set, cl.flags, cl.subcommands)
		}
		code[mp.page] = union(code[mp.page], set)
	}
	for pageName, set := range code {
		sameSet(t, "flag or command", pageName, set, readPage(t, pageName).termSet(t, sections[pageName]...))
	}
}

// TestMountOptionsDocumented: -o options and credentials-file keys.
func TestMountOptionsDocumented(t *testing.T) {
	mc := parsePackage(t, "cmd/internal/mountcmd")
	p := readPage(t, "lwio-mount.8.md")
	sameSet(t, "mount option", p.name, readMountOptions(t, mc, "applyOption"), p.termSet(t, "OPTIONS"))
	sameSet(t, "credentials file key", p.name, readFirstSwitch(t, mc, "readCredentials"), p.termSet(t, "CREDENTIALS FILE"))
}

// TestConfigKeysDocumented: every key of lwio-server's Config in
// lwio.toml(5), and the TOML in that page's examples and in the shipped
// example configuration uses only real keys; the shipped example shows
// every key.
func TestConfigKeysDocumented(t *testing.T) {
	keys := readTOMLKeys(t, parsePackage(t, "cmd/lwio-server"), "Config")
	p := readPage(t, "lwio.toml.5.md")
	doc := map[string]bool{}
	for s := range p.terms {
		if s != "FILES" {
			doc = union(doc, p.termSet(t, s))
		}
	}
	sameSet(t, "configuration key", p.name, keys, doc)
	if len(p.code["EXAMPLES"]) == 0 {
		t.Errorf("%s has no examples", p.name)
	}
	for i, ex := range p.code["EXAMPLES"] {
		for k := range tomlKeysOf(t, ex, keys) {
			if !keys[k] {
				t.Errorf("%s example %d: key %q is not a configuration key", p.name, i+1, k)
			}
		}
	}
	example, err := os.ReadFile(filepath.Join(repoRoot, "dist/server.toml"))
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, "configuration key", "dist/server.toml (commented out)", keys, tomlKeysOf(t, uncomment(string(example)), keys))
}

var commentedTOML = regexp.MustCompile(`^#(\[[a-z_.]+\]|[a-z_]+ = .*)$`)

// uncomment turns the commented-out keys and tables of the example
// configuration ("#path = ...", "#[shares.demo]") into TOML.
func uncomment(s string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		if commentedTOML.MatchString(line) {
			line = line[1:]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// tomlKeysOf decodes TOML text and names its keys the way readTOMLKeys
// does: the table under a map of tables becomes NAME.
func tomlKeysOf(t *testing.T, text string, known map[string]bool) map[string]bool {
	t.Helper()
	var m map[string]any
	if _, err := toml.Decode(text, &m); err != nil {
		t.Errorf("TOML does not parse: %v\n%s", err, text)
		return nil
	}
	out := map[string]bool{}
	var walk func(m map[string]any, prefix string)
	walk = func(m map[string]any, prefix string) {
		for k, v := range m {
			key := prefix + k
			if sub, ok := v.(map[string]any); ok {
				if hasPrefix(known, key+".NAME.") {
					for _, inner := range sub {
						if im, ok := inner.(map[string]any); ok {
							walk(im, key+".NAME.")
						}
					}
					continue
				}
				walk(sub, key+".")
				continue
			}
			out[key] = true
		}
	}
	walk(m, "")
	return out
}

func hasPrefix(set map[string]bool, prefix string) bool {
	for k := range set {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// TestCapabilitiesDocumented: lwio-server(8) explains each capability the
// unit keeps, and only those.
func TestCapabilitiesDocumented(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(repoRoot, "dist/lwio-server.service.in"))
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]bool{}
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "CapabilityBoundingSet="); ok {
			for _, c := range strings.Fields(v) {
				caps[c] = true
			}
		}
	}
	p := readPage(t, "lwio-server.8.md")
	sameSet(t, "capability", p.name+" (SYSTEMD) vs dist/lwio-server.service.in", caps, p.termSet(t, "SYSTEMD"))
}

// TestPagesRender renders each page with go-md2man, as make man does, and
// has groff format it with every warning on: a page must have NAME and
// SYNOPSIS and format without a warning.
func TestPagesRender(t *testing.T) {
	pages, _ := filepath.Glob("*.md")
	if len(pages) < 3 {
		t.Fatalf("pages: %v", pages)
	}
	groff, groffErr := exec.LookPath("groff")
	for _, name := range pages {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		roff := md2man.Render(src)
		for _, want := range []string{".TH ", ".SH NAME", ".SH SYNOPSIS", ".SH SEE ALSO"} {
			if !bytes.Contains(roff, []byte("\n"+want)) && !bytes.HasPrefix(roff, []byte(want)) {
				t.Errorf("%s: rendered page lacks %q", name, want)
			}
		}
		if groffErr != nil {
			continue
		}
		cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
		cmd.Stdin = bytes.NewReader(roff)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil || stderr.Len() > 0 {
			t.Errorf("%s: groff: %v\n%s", name, err, stderr.String())
		}
	}
	if groffErr != nil {
		t.Logf("groff not installed: pages rendered to roff but not formatted (make test-install formats them with man -l)")
	}
}
