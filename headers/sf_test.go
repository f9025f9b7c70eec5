package headers

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// The tree below is a test-only view of a parsed List, so tests can compare
// whole values and serialise them back (RFC 9651 Section 4.1).

// sfItem is an item or, when Value is []sfItem, an inner list.
type sfItem struct {
	Value  any // int64, sfDecimal, string, sfToken, []byte, bool, sfDate, sfDisplay or []sfItem
	Params []sfParam
}

type sfParam struct {
	Key   string
	Value any
}

type (
	sfDecimal int64 // thousandths
	sfToken   string
	sfDate    int64
	sfDisplay string
)

// parseListTree parses s as a List into a tree.
func parseListTree(s string) ([]sfItem, error) {
	list := []sfItem{}
	l := scanList(s)
	var m member
	for l.next(&m) {
		if got := s[m.start:m.end]; strings.TrimSpace(got) != got || got == "" {
			return nil, &syntaxError{m.start, "test: bad member span " + strconv.Quote(got)}
		}
		list = append(list, sfItem{Value: treeValue(m.value), Params: treeParams(m.params)})
	}
	return list, l.err
}

func treeValue(it bareItem) any {
	switch it.kind {
	case kindInteger:
		return it.num
	case kindDecimal:
		return sfDecimal(it.num)
	case kindString:
		return it.str()
	case kindToken:
		return sfToken(it.raw)
	case kindByteSequence:
		return it.bytes()
	case kindBoolean:
		return it.num == 1
	case kindDate:
		return sfDate(it.num)
	case kindDisplayString:
		return sfDisplay(it.str())
	case kindInnerList:
		items := []sfItem{}
		p := parser{s: it.raw}
		for {
			p.skipSP()
			if p.eof() {
				return items
			}
			var v bareItem
			if err := p.bareItem(&v); err != nil {
				panic("inner list was validated: " + err.Error())
			}
			params, err := p.params()
			if err != nil {
				panic("inner list was validated: " + err.Error())
			}
			items = append(items, sfItem{Value: treeValue(v), Params: treeParams(params)})
		}
	}
	panic("unknown kind " + strconv.Itoa(int(it.kind)))
}

// treeParams returns the parameters in order; a repeated key keeps its
// first position and takes its last value.
func treeParams(raw string) []sfParam {
	var params []sfParam
	p := parser{s: raw}
	for !p.eof() {
		p.i++
		p.skipSP()
		k, err := p.key()
		if err != nil {
			panic("params were validated: " + err.Error())
		}
		var v any = true
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			var it bareItem
			if err := p.bareItem(&it); err != nil {
				panic("params were validated: " + err.Error())
			}
			v = treeValue(it)
		}
		found := false
		for i := range params {
			if params[i].Key == k {
				params[i].Value, found = v, true
			}
		}
		if !found {
			params = append(params, sfParam{k, v})
		}
	}
	return params
}

// serializeList serialises a tree (RFC 9651 Section 4.1.1).
func serializeList(list []sfItem) string {
	var b []byte
	for i, it := range list {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendTreeItem(b, it)
	}
	return string(b)
}

func appendTreeItem(b []byte, it sfItem) []byte {
	b = appendTreeValue(b, it.Value)
	for _, p := range it.Params {
		b = append(b, ';')
		b = append(b, p.Key...)
		if v, ok := p.Value.(bool); ok && v {
			continue
		}
		b = append(b, '=')
		b = appendTreeValue(b, p.Value)
	}
	return b
}

func appendTreeValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case int64:
		return strconv.AppendInt(b, v, 10)
	case sfDecimal:
		if v < 0 {
			b = append(b, '-')
			v = -v
		}
		b = strconv.AppendInt(b, int64(v/1000), 10)
		frac := strings.TrimRight(strconv.Itoa(1000 + int(v%1000))[1:], "0")
		if frac == "" {
			frac = "0"
		}
		return append(append(b, '.'), frac...)
	case string:
		return appendString(b, v) // the tree only holds strings that need no '?'
	case sfToken:
		return append(b, v...)
	case []byte:
		b = append(b, ':')
		b = append(b, base64.StdEncoding.EncodeToString(v)...)
		return append(b, ':')
	case bool:
		if v {
			return append(b, "?1"...)
		}
		return append(b, "?0"...)
	case sfDate:
		return strconv.AppendInt(append(b, '@'), int64(v), 10)
	case sfDisplay:
		b = append(b, '%', '"')
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c == '%' || c == '"' || c < 0x20 || c > 0x7e {
				b = append(b, '%', "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
				continue
			}
			b = append(b, c)
		}
		return append(b, '"')
	case []sfItem:
		b = append(b, '(')
		for i, it := range v {
			if i > 0 {
				b = append(b, ' ')
			}
			b = appendTreeItem(b, it)
		}
		return append(b, ')')
	}
	panic("unknown tree value")
}

func item(v any, params ...sfParam) sfItem { return sfItem{Value: v, Params: params} }

func TestParseList(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []sfItem // nil: must fail
	}{
		// Lists.
		{"empty", "", []sfItem{}},
		{"only spaces", "   ", []sfItem{}},
		{"one", "42", []sfItem{item(int64(42))}},
		{"two", "1, 42", []sfItem{item(int64(1)), item(int64(42))}},
		{"no whitespace", "1,42", []sfItem{item(int64(1)), item(int64(42))}},
		{"whitespace around comma", "1 \t,\t 42", []sfItem{item(int64(1)), item(int64(42))}},
		{"leading and trailing spaces", "  1  ", []sfItem{item(int64(1))}},
		{"trailing tab", "1\t", []sfItem{item(int64(1))}},
		{"leading tab", "\t1", nil},
		{"trailing comma", "1, 42,", nil},
		{"trailing comma and space", "1, 42, ", nil},
		{"empty member", "1,,42", nil},
		{"leading comma", ",1", nil},
		{"missing comma", "1 2", nil},

		// Integers and Decimals.
		{"negative", "-42", []sfItem{item(int64(-42))}},
		{"zero padded", "0042", []sfItem{item(int64(42))}},
		{"negative zero", "-0", []sfItem{item(int64(0))}},
		{"largest integer", "999999999999999", []sfItem{item(int64(sfIntegerMax))}},
		{"smallest integer", "-999999999999999", []sfItem{item(int64(sfIntegerMin))}},
		{"16-digit integer", "1000000000000000", nil},
		{"lone minus", "-", nil},
		{"minus letter", "-a", nil},
		{"double minus", "--1", nil},
		{"decimal", "1.5", []sfItem{item(sfDecimal(1500))}},
		{"decimal three digits", "-123456789012.123", []sfItem{item(sfDecimal(-123456789012123))}},
		{"decimal 13 integer digits", "1234567890123.1", nil},
		{"decimal four fraction digits", "1.1234", nil},
		{"decimal trailing dot", "1.", nil},
		{"two dots", "1.2.3", nil},
		{"leading dot", ".5", nil},

		// Strings.
		{"string", `"hello world"`, []sfItem{item("hello world")}},
		{"empty string", `""`, []sfItem{item("")}},
		{"escaped quote and backslash", `"a\"b\\c"`, []sfItem{item(`a"b\c`)}},
		{"comma in string", `"a,b", c`, []sfItem{item("a,b"), item(sfToken("c"))}},
		{"bad escape", `"a\b"`, nil},
		{"trailing backslash", `"a\`, nil},
		{"unterminated string", `"abc`, nil},
		{"tab in string", "\"a\tb\"", nil},
		{"non-ASCII in string", "\"caf\xc3\xa9\"", nil},
		{"DEL in string", "\"\x7f\"", nil},

		// Tokens.
		{"token", "foo123/456", []sfItem{item(sfToken("foo123/456"))}},
		{"star token", "*foo:bar!", []sfItem{item(sfToken("*foo:bar!"))}},
		{"uppercase token", "Abc", []sfItem{item(sfToken("Abc"))}},
		{"token with digit first", "1abc", nil},
		{"token with bad char", "a@b", nil},

		// Byte Sequences.
		{"bytes", ":aGVsbG8=:", []sfItem{item([]byte("hello"))}},
		{"empty bytes", "::", []sfItem{item([]byte{})}},
		{"bytes without padding", ":aGVsbG8:", []sfItem{item([]byte("hello"))}},
		{"bytes non-zero pad bits", ":iZ==:", []sfItem{item([]byte{0x89})}},
		{"bytes two pad", ":YQ==:", []sfItem{item([]byte("a"))}},
		{"bytes unterminated", ":aGVsbG8=", nil},
		{"bytes with space", ":aGVs bG8=:", nil},
		{"bytes bad char", ":aGVsbG!8=:", nil},
		{"bytes data after padding", ":aGVsbG8=!:", nil},
		{"bytes data after =", ":YQ=A:", nil},
		{"bytes too much padding", ":YQ===:", nil},
		{"bytes padding on full quantum", ":YWJj=:", nil},
		{"bytes truncated", ":YWJjZ:", nil},
		{"bytes base64url", ":_-Ah:", nil},

		// Booleans, Dates, Display Strings.
		{"true", "?1", []sfItem{item(true)}},
		{"false", "?0", []sfItem{item(false)}},
		{"bad boolean", "?2", nil},
		{"lone question mark", "?", nil},
		{"date", "@1659578233", []sfItem{item(sfDate(1659578233))}},
		{"negative date", "@-1", []sfItem{item(sfDate(-1))}},
		{"decimal date", "@1.5", nil},
		{"lone at", "@", nil},
		{"display string", `%"f%c3%bc%c3%bc"`, []sfItem{item(sfDisplay("füü"))}},
		{"display string quote", `%"a %22b%22 \ c"`, []sfItem{item(sfDisplay(`a "b" \ c`))}},
		{"display string uppercase hex", `%"f%C3%BC"`, nil},
		{"display string invalid UTF-8", `%"%c3%28"`, nil},
		{"display string truncated UTF-8", `%"%c3"`, nil},
		{"display string surrogate", `%"%ed%a0%80"`, nil},
		{"display string short escape", `%"%a"`, nil},
		{"display string unquoted", `%foo`, nil},
		{"display string unterminated", `%"foo`, nil},
		{"display string tab", "%\"\t\"", nil},

		// Parameters.
		{"parameters", `"a";q=100;w=60`, []sfItem{item("a", sfParam{"q", int64(100)}, sfParam{"w", int64(60)})}},
		{"parameter without value", "a;x", []sfItem{item(sfToken("a"), sfParam{"x", true})}},
		{"parameter spaces after ;", "a; x=1", []sfItem{item(sfToken("a"), sfParam{"x", int64(1)})}},
		{"repeated parameter", "a;x=1;y=2;x=3", []sfItem{item(sfToken("a"), sfParam{"x", int64(3)}, sfParam{"y", int64(2)})}},
		{"parameter key chars", "a;*k_.-9=?0", []sfItem{item(sfToken("a"), sfParam{"*k_.-9", false})}},
		{"uppercase key", "a;X=1", nil},
		{"space before ;", "a ;x=1", nil},
		{"space before =", "a;x =1", nil},
		{"space after =", "a;x= 1", nil},
		{"parameter missing value", "a;x=", nil},
		{"parameter inner list value", "a;x=(1)", nil},

		// Inner lists.
		{"inner list", "(1 2);p, 3", []sfItem{item([]sfItem{item(int64(1)), item(int64(2))}, sfParam{"p", true}), item(int64(3))}},
		{"empty inner list", "()", []sfItem{item([]sfItem{})}},
		{"inner list spaces", "(  1  a;b=2 )", []sfItem{item([]sfItem{item(int64(1)), item(sfToken("a"), sfParam{"b", int64(2)})})}},
		{"inner list tab", "(1\t2)", nil},
		{"unterminated inner list", "(1 2", nil},
		{"nested inner list", "((1))", nil},
		{"inner list missing space", `("a""b")`, nil},

		// Other.
		{"bad first character", "!", nil},
		{"rate limit example", `"burst";q=100;w=60,"daily";q=1000;w=86400`, []sfItem{
			item("burst", sfParam{"q", int64(100)}, sfParam{"w", int64(60)}),
			item("daily", sfParam{"q", int64(1000)}, sfParam{"w", int64(86400)}),
		}},
		{"rate limit with pk", `"default";r=999;pk=:dHJpYWwxMjEzMjM=:`, []sfItem{
			item("default", sfParam{"r", int64(999)}, sfParam{"pk", []byte("trial121323")}),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseListTree(tt.in)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("parseListTree(%q) = %#v, want an error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseListTree(%q): %v", tt.in, err)
			}
			if !same(got, tt.want) {
				t.Fatalf("parseListTree(%q)\n got %#v\nwant %#v", tt.in, got, tt.want)
			}
		})
	}
}

func TestSerializeListRoundTrip(t *testing.T) {
	tests := []struct{ in, want string }{
		{`"a";q=1;w=2, "b";q=3;w=4`, `"a";q=1;w=2, "b";q=3;w=4`},
		{"1.50, -0.1, 2.0", "1.5, -0.1, 2.0"},
		{":aGVsbG8:;x=?1;y=?0", ":aGVsbG8=:;x;y=?0"},
		{`(1  "a\"" tok);k=@5  ,  %"%c3%bc%22"`, `(1 "a\"" tok);k=@5, %"%c3%bc%22"`},
	}
	for _, tt := range tests {
		list, err := parseListTree(tt.in)
		if err != nil {
			t.Fatalf("parseListTree(%q): %v", tt.in, err)
		}
		if got := serializeList(list); got != tt.want {
			t.Errorf("serializeList(parseListTree(%q)) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSyntaxErrorMessage(t *testing.T) {
	_, err := parseListTree("1, !")
	if err == nil {
		t.Fatal("parseListTree(\"1, !\"): got no error")
	}
	if got, want := err.Error(), "headers: invalid structured field: unexpected character at offset 3"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMemberParam(t *testing.T) {
	in := `"a";r=0;t=5;r=1;flag;s="x", tok;t=1.5`
	l := scanList(in)
	var ms []member
	var m member
	for l.next(&m) {
		ms = append(ms, m)
	}
	if l.err != nil || len(ms) != 2 {
		t.Fatalf("scanList(%q): %d members, err %v; want 2, nil", in, len(ms), l.err)
	}
	if r, ok := ms[0].intParam("r"); !ok || r != 1 {
		t.Errorf("r: got %d, %v; want 1, true (the last value wins)", r, ok)
	}
	if v, ok := ms[0].param("flag"); !ok || v.kind != kindBoolean || v.num != 1 {
		t.Errorf("flag: got %+v, %v; want Boolean true", v, ok)
	}
	if _, ok := ms[0].intParam("s"); ok {
		t.Error(`intParam("s") on a String: got ok, want not ok`)
	}
	if _, ok := ms[0].param("missing"); ok {
		t.Error(`param("missing"): got ok, want not ok`)
	}
	if _, ok := ms[1].intParam("t"); ok {
		t.Error(`intParam("t") on a Decimal: got ok, want not ok`)
	}
	if got, want := in[ms[1].start:ms[1].end], "tok;t=1.5"; got != want {
		t.Errorf("second member span: got %q, want %q", got, want)
	}
}

func TestIsString(t *testing.T) {
	tests := []struct {
		raw, name string
		want      bool
	}{
		{`abc`, "abc", true},
		{`abc`, "abd", false},
		{`abc`, "ab", false},
		{`ab`, "abc", false},
		{``, "", true},
		{`a\"b\\`, `a"b\`, true},
		{`a\"b`, `a\b`, false},
		{`caf??`, "caf\xc3\xa9", true}, // names are compared after sanitising
		{`?`, "\x00", true},
	}
	for _, tt := range tests {
		it := bareItem{kind: kindString, raw: tt.raw}
		if got := it.isString(tt.name); got != tt.want {
			t.Errorf("String %q isString(%q): got %v, want %v", tt.raw, tt.name, got, tt.want)
		}
	}
	if (bareItem{kind: kindToken, raw: "abc"}).isString("abc") {
		t.Error(`Token abc isString("abc"): got true, want false`)
	}
}

// FuzzParseList checks that the parser never panics, and that whatever it
// accepts serialises to a List that parses back to the same value.
func FuzzParseList(f *testing.F) {
	for _, s := range []string{
		"", "1, 42", `"burst";q=100;w=60,"daily";q=1000;w=86400`, `"a\"b";r=0;t=1`,
		"(1 2);p, 3", ":aGVsbG8=:", "?1;a;b=?0", "@1659578233", `%"f%c3%bc"`,
		"-12.345;x=tok/a:b", "1.", `"unterminated`, "a;b=(1)",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		list, err := parseListTree(s)
		if err != nil {
			return
		}
		out := serializeList(list)
		again, err := parseListTree(out)
		if err != nil {
			t.Fatalf("parseListTree(%q) = %#v, serialised as %q, which does not parse: %v", s, list, out, err)
		}
		if !same(normalise(again), normalise(list)) {
			t.Fatalf("round trip of %q through %q:\n got %#v\nwant %#v", s, out, again, list)
		}
		if out2 := serializeList(again); out2 != out {
			t.Fatalf("serialisation is not stable: %q then %q", out, out2)
		}
	})
}

// same reports whether two parse trees print alike in Go syntax: the same
// types and values (a nil byte slice and an empty one differ).
func same(a, b any) bool { return fmt.Sprintf("%#v", a) == fmt.Sprintf("%#v", b) }

// normalise makes trees comparable with same: nil and empty byte slices are
// the same value.
func normalise(list []sfItem) []sfItem {
	out := make([]sfItem, len(list))
	for i, it := range list {
		out[i] = sfItem{Value: normaliseValue(it.Value)}
		for _, p := range it.Params {
			out[i].Params = append(out[i].Params, sfParam{p.Key, normaliseValue(p.Value)})
		}
	}
	return out
}

func normaliseValue(v any) any {
	switch v := v.(type) {
	case []byte:
		return string(bytes.Clone(v)) + "\x00bytes"
	case []sfItem:
		return normalise(v)
	}
	return v
}
