package logshape

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/overlay-plugin/overlay-plugin/"

// product is the plugin's binary: the packages it is built from are those
// whose log lines an operator sees. Fakes, test harnesses and the bench
// module are not among them (layering's rules keep them out).
const product = "cmd/overlay-plugin"

// maxKey is the longest message allowed: a key names an event in a few
// words; anything longer is an explanation, which belongs in an attribute.
const maxKey = 48

// detail is the punctuation that glues an explanation onto a key
// ("x: because y; do z", "x (use y)").
const detail = ":;,.()"

// msgArg is, for each slog.Logger method and slog function that logs or
// makes a record, the index of its message argument.
var msgArg = map[string]int{
	"Debug": 0, "Info": 0, "Warn": 0, "Error": 0,
	"DebugContext": 1, "InfoContext": 1, "WarnContext": 1, "ErrorContext": 1,
	"Log": 2, "LogAttrs": 2, "NewRecord": 2,
}

// passThrough are the functions that log text the plugin does not write,
// by package, receiver type and name.
var passThrough = map[string]string{
	"cluster.mlLogWriter.Write": "memberlist's own log lines, at their level",
}

// deferred are the functions that log messages made elsewhere, in a
// struct, so that they log after a lock is released: the messages are
// checked in the struct's literals, in the same package.
var deferred = map[string]struct{ typ, field string }{
	"health.Prober.logEvents": {"event", "msg"},
}

// TestLogMessagesAreKeys parses every non-test Go file of the packages the
// plugin is built from and fails, naming file:line, for each log call
// whose message is not a constant or is more than a short key. A function
// that passes one of its string parameters on as the message (a wrapper
// such as cluster's reject) has the message checked at its callers.
func TestLogMessagesAreKeys(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	load(t, fset, root, product, pkgs)

	// Wrappers, found until none is added: a wrapper's caller may itself
	// pass its own parameter on.
	wrappers := map[string]int{}
	for {
		n := len(wrappers)
		eachCall(pkgs, wrappers, func(pkg string, fn *ast.FuncDecl, call *ast.CallExpr, i int) {
			if j, ok := stringParam(fn, call.Args[i]); ok {
				wrappers[funcKey(pkg, fn)] = j
			}
		})
		if len(wrappers) == n {
			break
		}
	}

	calls := 0
	where := func(e ast.Expr) token.Position {
		pos := fset.Position(e.Pos())
		if rel, err := filepath.Rel(root, pos.Filename); err == nil {
			pos.Filename = rel
		}
		return pos
	}
	// check checks a constant message and says whether it was one.
	check := func(arg ast.Expr) bool {
		msg, ok := constString(arg)
		if ok {
			if why := badKey(msg); why != "" {
				t.Errorf("%s: %q: %s", where(arg), msg, why)
			}
		}
		return ok
	}
	nonConstant := func(arg ast.Expr) {
		t.Errorf("%s: the message is not a constant string: a key must not change from one call to the next", where(arg))
	}
	exempt := map[string]bool{}
	eachCall(pkgs, wrappers, func(pkg string, fn *ast.FuncDecl, call *ast.CallExpr, i int) {
		calls++
		arg := call.Args[i]
		if check(arg) {
			return
		}
		if _, ok := stringParam(fn, arg); ok {
			return // a wrapper: checked at its callers
		}
		if fn != nil {
			name := methodName(pkg, fn)
			if passThrough[name] != "" {
				exempt[name] = true
				return
			}
			if d, ok := deferred[name]; ok {
				exempt[name] = true
				n := 0
				eachLiteral(pkgs[pkg], d.typ, d.field, func(arg ast.Expr) {
					n++
					if !check(arg) {
						nonConstant(arg)
					}
				})
				if n == 0 {
					t.Errorf("%s logs the %s of %s literals, and there are none", name, d.field, d.typ)
				}
				return
			}
		}
		nonConstant(arg)
	})
	if calls < 100 {
		t.Fatalf("only %d log calls found: the walk misses the tree", calls)
	}
	for name := range passThrough {
		if !exempt[name] {
			t.Errorf("passThrough names %s, which logs no message of its own any more: remove it", name)
		}
	}
	for name := range deferred {
		if !exempt[name] {
			t.Errorf("deferred names %s, which logs no message made elsewhere any more: remove it", name)
		}
	}
	t.Logf("%d log calls in %d packages, %d wrappers", calls, len(pkgs), len(wrappers))
}

// eachLiteral calls f with the field's value in each composite literal
// of the struct type typ in files.
func eachLiteral(files []*ast.File, typ, field string, f func(ast.Expr)) {
	index := -1
	for _, file := range files {
		ast.Inspect(file, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == typ {
				if st, ok := ts.Type.(*ast.StructType); ok {
					i := 0
					for _, fl := range st.Fields.List {
						for _, name := range fl.Names {
							if name.Name == field {
								index = i
							}
							i++
						}
					}
				}
			}
			return true
		})
	}
	for _, file := range files {
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != typ {
				return true
			}
			for i, elt := range lit.Elts {
				if kv, ok := elt.(*ast.KeyValueExpr); ok {
					if key, ok := kv.Key.(*ast.Ident); ok && key.Name == field {
						f(kv.Value)
					}
				} else if i == index {
					f(elt)
				}
			}
			return true
		})
	}
}

// load parses the non-test files of pkg and of every package of this
// module it imports, into pkgs. It reads the directories alone (no go
// command), which keeps the test fast.
func load(t *testing.T, fset *token.FileSet, root, pkg string, pkgs map[string][]*ast.File) {
	if _, done := pkgs[pkg]; done {
		return
	}
	dir := filepath.Join(root, filepath.FromSlash(pkg))
	p, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatalf("%s: %v", pkg, err)
	}
	pkgs[pkg] = nil
	// The files of other platforms and build tags too: the check is of
	// the source, not of one build.
	names := append(append(append([]string(nil), p.GoFiles...), p.CgoFiles...), p.IgnoredGoFiles...)
	for _, name := range names {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != p.Name {
			continue // a generator or the like under an ignore tag
		}
		pkgs[pkg] = append(pkgs[pkg], f)
	}
	for _, imp := range p.Imports {
		if dep, ok := strings.CutPrefix(imp, module); ok {
			load(t, fset, root, dep, pkgs)
		}
	}
}

// eachCall calls f for each call that logs (a slog method or function) or
// that calls a wrapper, with the index of its message argument and the
// function declaring it (nil at package level).
func eachCall(pkgs map[string][]*ast.File, wrappers map[string]int, f func(pkg string, fn *ast.FuncDecl, call *ast.CallExpr, i int)) {
	for pkg, files := range pkgs {
		for _, file := range files {
			for _, decl := range file.Decls {
				fn, _ := decl.(*ast.FuncDecl)
				ast.Inspect(decl, func(n ast.Node) bool {
					if call, ok := n.(*ast.CallExpr); ok {
						if i, ok := messageArg(pkg, call, wrappers); ok && i < len(call.Args) {
							f(pkg, fn, call, i)
						}
					}
					return true
				})
			}
		}
	}
}

// messageArg says which argument of call is a log message, if any. A
// wrapper is known by its name within its package: x.name(...) for a
// method (or a field holding one), name(...) for a function.
func messageArg(pkg string, call *ast.CallExpr, wrappers map[string]int) (int, bool) {
	switch fun := call.Fun.(type) {
	case *ast.SelectorExpr:
		if i, ok := msgArg[fun.Sel.Name]; ok {
			return i, true
		}
		i, ok := wrappers[pkg+".*."+fun.Sel.Name]
		return i, ok
	case *ast.Ident:
		i, ok := wrappers[pkg+"."+fun.Name]
		return i, ok
	}
	return 0, false
}

// funcKey names a function for wrappers: "pkg.name", or "pkg.*.name" for
// a method, which matches any receiver.
func funcKey(pkg string, fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return pkg + "." + fn.Name.Name
	}
	return pkg + ".*." + fn.Name.Name
}

// methodName names a function for passThrough: "pkg.name" or
// "pkg.Type.name".
func methodName(pkg string, fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return pkg + "." + fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	return pkg + "." + typeName(typ) + "." + fn.Name.Name
}

func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr: // a generic type
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	}
	return "?"
}

// stringParam says whether e is a string parameter of fn, and which.
func stringParam(fn *ast.FuncDecl, e ast.Expr) (int, bool) {
	id, ok := e.(*ast.Ident)
	if !ok || fn == nil {
		return 0, false
	}
	i := 0
	for _, field := range fn.Type.Params.List {
		for _, name := range field.Names {
			if name.Name == id.Name {
				typ, ok := field.Type.(*ast.Ident)
				return i, ok && typ.Name == "string"
			}
			i++
		}
		if len(field.Names) == 0 {
			i++
		}
	}
	return 0, false
}

// badKey says what is wrong with msg as a key, or "" when nothing is.
func badKey(msg string) string {
	switch {
	case msg == "":
		return "empty message"
	case len(msg) > maxKey:
		return fmt.Sprintf("longer than %d characters: move the explanation into a why or hint attribute", maxKey)
	case strings.ContainsAny(msg, detail):
		return fmt.Sprintf("detail glued on with one of %q: move it into a why or hint attribute", detail)
	case strings.TrimSpace(msg) != msg || strings.Contains(msg, "  "):
		return "stray spaces"
	}
	return ""
}

// constString evaluates a string literal or a concatenation of them.
func constString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.ParenExpr:
		return constString(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok := constString(e.X)
		if !ok {
			return "", false
		}
		y, ok := constString(e.Y)
		return x + y, ok
	}
	return "", false
}
