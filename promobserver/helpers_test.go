package promobserver_test

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

// samples collects the metrics names of c (all of them without names),
// through a pedantic registry, which also checks their consistency, and
// returns every sample of the text exposition: `name{label="value",...}` →
// value. Labels are in the exposition's order, sorted by name; histograms
// give their _bucket, _sum and _count lines.
func samples(t *testing.T, c prometheus.Collector, names ...string) map[string]float64 {
	t.Helper()
	if len(names) == 0 { // CollectAndFormat formats only the metrics it is given
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			names = append(names, f.GetName())
		}
		if len(names) == 0 {
			return map[string]float64{}
		}
	}
	text, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, names...)
	if err != nil {
		t.Fatal(err)
	}
	return parseSamples(t, string(text))
}

// parseSamples returns the samples of a text exposition, as samples does.
func parseSamples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	got := make(map[string]float64)
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		got[line[:i]] = v
	}
	return got
}

// checkSamples fails unless got has exactly the samples of want.
func checkSamples(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for _, k := range sortedKeys(want) {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("missing %s, want %v", k, want[k])
		case g != want[k]:
			t.Errorf("%s = %v, want %v", k, g, want[k])
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s = %v", k, got[k])
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var labelRE = regexp.MustCompile(`([a-z_]+)="((?:[^"\\]|\\.)*)"`)

// labelValues returns the distinct values of label among the samples.
func labelValues(s map[string]float64, label string) map[string]bool {
	vals := make(map[string]bool)
	for k := range s {
		for _, m := range labelRE.FindAllStringSubmatch(k, -1) {
			if m[1] == label {
				vals[m[2]] = true
			}
		}
	}
	return vals
}

// sum adds up the samples of metric whose labels include every one of
// match (`outcome="denied"`).
func sum(s map[string]float64, metric string, match ...string) float64 {
	total := 0.0
outer:
	for k, v := range s {
		if !strings.HasPrefix(k, metric+"{") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(k, m) {
				continue outer
			}
		}
		total += v
	}
	return total
}
