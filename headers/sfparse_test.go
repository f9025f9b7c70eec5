package headers

// This file holds an RFC 9651 Structured Field List parser, for the tests
// and the fuzzers: every value Write leaves must parse with it. It follows
// the parsing algorithms of RFC 9651 Section 4.2 step by step, including
// inner lists, Dates and Display Strings; a listScanner yields one member at
// a time, with its parameters kept as validated raw text.

import (
	"encoding/base64"
	"strconv"
	"strings"
	"unicode/utf8"
)

// itemKind is the type of a bare item (or an inner list) in a Structured Field.
type itemKind uint8

const (
	kindInteger itemKind = iota + 1
	kindDecimal
	kindString
	kindToken
	kindByteSequence
	kindBoolean
	kindDate
	kindDisplayString
	kindInnerList
)

// Bounds of an RFC 9651 Integer (Section 3.3.1): at most 15 digits.
const sfIntegerMin = -sfIntegerMax

// bareItem is one parsed bare item, or an inner list when kind is kindInnerList.
//
// num holds Integers, Dates, Booleans (0 or 1) and Decimals (in thousandths,
// which is exact: a Decimal has at most three fractional digits).
// raw holds the text of the item in the input without its delimiters: the
// still-escaped content of a String, a Token, the base64 text of a Byte
// Sequence, the still-percent-encoded content of a Display String, the text
// between the parentheses of an inner list, and the literal of a number.
type bareItem struct {
	kind itemKind
	num  int64
	raw  string
}

// str returns the value of a String or Display String item, unescaped.
// It allocates only when the content has escapes.
func (it bareItem) str() string {
	switch it.kind {
	case kindString:
		if strings.IndexByte(it.raw, '\\') < 0 {
			return it.raw
		}
		b := make([]byte, 0, len(it.raw))
		for i := 0; i < len(it.raw); i++ {
			if it.raw[i] == '\\' {
				i++ // validated: a backslash is always followed by '"' or '\'
			}
			b = append(b, it.raw[i])
		}
		return string(b)
	case kindDisplayString:
		if strings.IndexByte(it.raw, '%') < 0 {
			return it.raw
		}
		b := make([]byte, 0, len(it.raw))
		for i := 0; i < len(it.raw); i++ {
			if it.raw[i] == '%' {
				b = append(b, unhex(it.raw[i+1])<<4|unhex(it.raw[i+2]))
				i += 2
				continue
			}
			b = append(b, it.raw[i])
		}
		return string(b)
	}
	return ""
}

// isString reports whether it is a String whose value is name after
// [appendString]'s sanitising, without allocating.
func (it bareItem) isString(name string) bool {
	if it.kind != kindString {
		return false
	}
	raw := it.raw
	j := 0
	for i := 0; i < len(name); i++ {
		if j == len(raw) {
			return false
		}
		c := raw[j]
		if c == '\\' {
			j++
			c = raw[j]
		}
		want := name[i]
		if want < 0x20 || want > 0x7e {
			want = '?' // as appendString writes it
		}
		if c != want {
			return false
		}
		j++
	}
	return j == len(raw)
}

// bytes returns the decoded value of a Byte Sequence item.
func (it bareItem) bytes() []byte {
	// Validated by the parser; padding is synthesised and non-zero pad bits
	// are accepted, as RFC 9651 Section 4.2.7 recommends.
	b, _ := base64.RawStdEncoding.DecodeString(strings.TrimRight(it.raw, "="))
	return b
}

// member is one member of a List: an item or an inner list, and its parameters.
type member struct {
	start, end int      // the member's span in the scanned input, parameters included
	value      bareItem // the bare item, or the inner list
	params     string   // the parameters as written, from the first ';' (already validated)
}

// param returns the value of the parameter named key. A parameter without a
// value is Boolean true; when a key repeats, the last value wins
// (RFC 9651 Section 4.2.3.2).
func (m *member) param(key string) (v bareItem, ok bool) {
	p := parser{s: m.params}
	for !p.eof() {
		p.i++ // ';'
		p.skipSP()
		k, err := p.key()
		if err != nil {
			break // not reached: params were validated when m was scanned
		}
		val := bareItem{kind: kindBoolean, num: 1}
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			if p.bareItem(&val) != nil {
				break // not reached, as above
			}
		}
		if k == key {
			v, ok = val, true
		}
	}
	return v, ok
}

// intParam returns the parameter named key when it is an Integer.
func (m *member) intParam(key string) (int64, bool) {
	v, ok := m.param(key)
	if !ok || v.kind != kindInteger {
		return 0, false
	}
	return v.num, true
}

// syntaxError reports where and why a Structured Field failed to parse.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string {
	return "headers: invalid structured field: " + e.msg + " at offset " + strconv.Itoa(e.off)
}

// listScanner walks the members of an RFC 9651 List (Section 4.2.1).
// A List is valid only if the scan reaches its end with a nil err: callers
// must not act on the members they saw until then.
type listScanner struct {
	p       parser
	err     error
	started bool
	done    bool
}

// scanList returns a scanner over the List in s, which is one field value
// (field lines already combined with ", ").
func scanList(s string) listScanner {
	l := listScanner{p: parser{s: s}}
	l.p.skipSP() // leading SP is discarded before parsing (Section 4.2)
	return l
}

// next stores the next member in m and reports whether there was one. It
// returns false at the end of the List and on an error, which err then holds.
func (l *listScanner) next(m *member) bool {
	if l.done {
		return false
	}
	p := &l.p
	if !l.started {
		l.started = true
		if p.eof() {
			l.done = true // the empty List
			return false
		}
	} else {
		p.skipOWS()
		if p.eof() {
			l.done = true
			return false
		}
		if p.s[p.i] != ',' {
			return l.fail(p.errorf("expected ',' after a list member"))
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return l.fail(p.errorf("trailing ','"))
		}
	}
	m.start = p.i
	if err := p.itemOrInnerList(m); err != nil {
		return l.fail(err)
	}
	m.end = p.i
	return true
}

func (l *listScanner) fail(err error) bool {
	l.err, l.done = err, true
	return false
}

// parser holds an input and the offset of the next byte to parse.
type parser struct {
	s string
	i int
}

func (p *parser) eof() bool { return p.i >= len(p.s) }

func (p *parser) errorf(msg string) error { return &syntaxError{off: p.i, msg: msg} }

func (p *parser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

// skipOWS skips optional whitespace: SP and HTAB.
func (p *parser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// itemOrInnerList parses Section 4.2.1.1 into m.value and m.params.
func (p *parser) itemOrInnerList(m *member) error {
	if p.s[p.i] == '(' {
		if err := p.innerList(&m.value); err != nil {
			return err
		}
	} else if err := p.bareItem(&m.value); err != nil {
		return err
	}
	params, err := p.params()
	m.params = params
	return err
}

// innerList parses the items of an inner list (Section 4.2.1.2), without its
// parameters, keeping the text between the parentheses in it.raw.
func (p *parser) innerList(it *bareItem) error {
	p.i++ // '('
	start := p.i
	for {
		p.skipSP()
		if p.eof() {
			return p.errorf("unterminated inner list")
		}
		if p.s[p.i] == ')' {
			*it = bareItem{kind: kindInnerList, raw: p.s[start:p.i]}
			p.i++
			return nil
		}
		var inner bareItem
		if err := p.bareItem(&inner); err != nil {
			return err
		}
		if _, err := p.params(); err != nil {
			return err
		}
		if !p.eof() && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return p.errorf("expected ' ' or ')' in an inner list")
		}
	}
}

// params parses Parameters (Section 4.2.3.2) and returns their text.
func (p *parser) params() (string, error) {
	start := p.i
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		if _, err := p.key(); err != nil {
			return "", err
		}
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			var v bareItem
			if err := p.bareItem(&v); err != nil {
				return "", err
			}
		}
	}
	return p.s[start:p.i], nil
}

// key parses a Key (Section 4.2.3.3).
func (p *parser) key() (string, error) {
	start := p.i
	if p.eof() || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", p.errorf("expected a key")
	}
	p.i++
	for !p.eof() {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

// bareItem parses a Bare Item (Section 4.2.3.1).
func (p *parser) bareItem(it *bareItem) error {
	if p.eof() {
		return p.errorf("expected an item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.number(it)
	case c == '"':
		return p.str(it)
	case c == '*' || isAlpha(c):
		return p.token(it)
	case c == ':':
		return p.byteSequence(it)
	case c == '?':
		return p.boolean(it)
	case c == '@':
		return p.date(it)
	case c == '%':
		return p.displayString(it)
	}
	return p.errorf("unexpected character")
}

// number parses an Integer or a Decimal (Section 4.2.4).
func (p *parser) number(it *bareItem) error {
	start := p.i
	neg := false
	if p.s[p.i] == '-' {
		neg = true
		p.i++
	}
	if p.eof() || !isDigit(p.s[p.i]) {
		return p.errorf("expected a digit")
	}
	var whole, frac int64
	n, fracDigits, decimal := 0, 0, false // n counts digits and '.', not the sign
	for !p.eof() {
		c := p.s[p.i]
		switch {
		case isDigit(c) && decimal:
			frac = frac*10 + int64(c-'0')
			fracDigits++
		case isDigit(c):
			whole = whole*10 + int64(c-'0')
		case c == '.' && !decimal:
			if n > 12 {
				return p.errorf("decimal with more than 12 integer digits")
			}
			decimal = true
		default:
			goto done
		}
		p.i++
		n++
		if !decimal && n > 15 {
			return p.errorf("integer with more than 15 digits")
		}
		if decimal && n > 16 {
			return p.errorf("decimal too long")
		}
	}
done:
	if decimal {
		if fracDigits == 0 {
			return p.errorf("decimal ends with '.'")
		}
		if fracDigits > 3 {
			return p.errorf("decimal with more than 3 fractional digits")
		}
		for ; fracDigits < 3; fracDigits++ {
			frac *= 10
		}
		*it = bareItem{kind: kindDecimal, num: whole*1000 + frac}
	} else {
		*it = bareItem{kind: kindInteger, num: whole}
	}
	if neg {
		it.num = -it.num
	}
	it.raw = p.s[start:p.i]
	return nil
}

// str parses a String (Section 4.2.5).
func (p *parser) str(it *bareItem) error {
	p.i++ // '"'
	start := p.i
	for !p.eof() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.eof() {
				return p.errorf("unterminated string")
			}
			if c := p.s[p.i]; c != '"' && c != '\\' {
				return p.errorf("invalid escape in a string")
			}
			p.i++
		case c == '"':
			*it = bareItem{kind: kindString, raw: p.s[start : p.i-1]}
			return nil
		case c < 0x20 || c > 0x7e:
			p.i--
			return p.errorf("invalid character in a string")
		}
	}
	return p.errorf("unterminated string")
}

// token parses a Token (Section 4.2.6).
func (p *parser) token(it *bareItem) error {
	start := p.i
	p.i++ // ALPHA or '*', checked by the caller
	for !p.eof() && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	*it = bareItem{kind: kindToken, raw: p.s[start:p.i]}
	return nil
}

// byteSequence parses a Byte Sequence (Section 4.2.7). Missing '=' padding
// and non-zero pad bits are accepted, as the RFC recommends; anything else
// that is not base64 fails.
func (p *parser) byteSequence(it *bareItem) error {
	p.i++ // ':'
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return p.errorf("unterminated byte sequence")
	}
	b64 := p.s[p.i : p.i+end]
	data := len(b64) // characters before the first '='
	for i := 0; i < len(b64); i++ {
		c := b64[i]
		switch {
		case c == '=':
			if data == len(b64) {
				data = i
			}
		case isAlpha(c) || isDigit(c) || c == '+' || c == '/':
			if data != len(b64) {
				return p.errorf("base64 data after '='")
			}
		default:
			return p.errorf("invalid base64 character")
		}
	}
	pad := len(b64) - data
	switch {
	case data%4 == 1:
		return p.errorf("truncated base64")
	case pad > 0 && (data%4 == 0 || pad != 4-data%4):
		return p.errorf("invalid base64 padding")
	}
	*it = bareItem{kind: kindByteSequence, raw: b64}
	p.i += end + 1
	return nil
}

// boolean parses a Boolean (Section 4.2.8).
func (p *parser) boolean(it *bareItem) error {
	p.i++ // '?'
	if p.eof() || (p.s[p.i] != '0' && p.s[p.i] != '1') {
		return p.errorf("expected ?0 or ?1")
	}
	*it = bareItem{kind: kindBoolean, num: int64(p.s[p.i] - '0')}
	p.i++
	return nil
}

// date parses a Date (Section 4.2.9).
func (p *parser) date(it *bareItem) error {
	p.i++ // '@'
	if p.eof() {
		return p.errorf("expected a date")
	}
	start := p.i
	if err := p.number(it); err != nil {
		return err
	}
	if it.kind != kindInteger {
		p.i = start
		return p.errorf("date is not an integer")
	}
	it.kind = kindDate
	return nil
}

// displayString parses a Display String (Section 4.2.10).
func (p *parser) displayString(it *bareItem) error {
	p.i++ // '%'
	if p.eof() || p.s[p.i] != '"' {
		return p.errorf(`expected '"' after '%'`)
	}
	p.i++
	start := p.i
	// The decoded bytes must be UTF-8: check them rune by rune as they come,
	// keeping an incomplete rune's bytes in pending.
	var pending [utf8.UTFMax]byte
	n := 0
	for !p.eof() {
		c := p.s[p.i]
		switch {
		case c < 0x20 || c > 0x7e:
			return p.errorf("invalid character in a display string")
		case c == '"':
			if n > 0 {
				return p.errorf("display string is not UTF-8")
			}
			*it = bareItem{kind: kindDisplayString, raw: p.s[start:p.i]}
			p.i++
			return nil
		case c == '%':
			if p.i+2 >= len(p.s) || !isLCHex(p.s[p.i+1]) || !isLCHex(p.s[p.i+2]) {
				return p.errorf("invalid percent-encoding in a display string")
			}
			pending[n] = unhex(p.s[p.i+1])<<4 | unhex(p.s[p.i+2])
			n++
			if utf8.FullRune(pending[:n]) {
				if r, size := utf8.DecodeRune(pending[:n]); r == utf8.RuneError && size == 1 {
					return p.errorf("display string is not UTF-8")
				}
				n = 0
			}
			p.i += 3
			continue
		}
		if n > 0 {
			return p.errorf("display string is not UTF-8")
		}
		p.i++
	}
	return p.errorf("unterminated display string")
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }
func isLCHex(c byte) bool   { return isDigit(c) || ('a' <= c && c <= 'f') }

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// isTChar reports whether c is a tchar (RFC 9110 Section 5.6.2).
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
