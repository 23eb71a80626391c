// promql-check DASHBOARD.json... : every query of a Grafana dashboard parsed by Prometheus's own PromQL
// parser, with Grafana's variables replaced by values of their kind, so that a query Prometheus would
// refuse fails `make lint` instead of leaving a panel empty. Which metrics and labels the queries name is
// tests/unit/test_grafana_dashboard.py's part. Built by hack/dashboard-lint.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"github.com/prometheus/prometheus/promql/parser"
)

type panel struct {
	Title   string  `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// Grafana's range variables become a duration; a template variable sits inside a quoted matcher value.
var (
	rangeVariable    = regexp.MustCompile(`\$__(rate_interval|range|interval)\b`)
	templateVariable = regexp.MustCompile(`\$\{?\w+\}?`)
)

func check(p parser.Parser, panels []panel, file string) (failures int) {
	for _, pn := range panels {
		for _, target := range pn.Targets {
			expr := templateVariable.ReplaceAllString(rangeVariable.ReplaceAllString(target.Expr, "5m"), "x")
			if _, err := p.ParseExpr(expr); err != nil {
				fmt.Fprintf(os.Stderr, "%s: panel %q: %s\n  %s\n", file, pn.Title, err, target.Expr)
				failures++
			}
		}
		failures += check(p, pn.Panels, file)
	}
	return failures
}

func main() {
	p := parser.NewParser(parser.Options{})
	failures := 0
	for _, file := range os.Args[1:] {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		var board struct {
			Panels []panel `json:"panels"`
		}
		if err := json.Unmarshal(data, &board); err != nil {
			fmt.Fprintf(os.Stderr, "%s: not a dashboard: %s\n", file, err)
			os.Exit(2)
		}
		failures += check(p, board.Panels, file)
	}
	if failures > 0 {
		os.Exit(1)
	}
}
