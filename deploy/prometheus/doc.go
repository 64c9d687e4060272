// Package promdeploy holds sys1's Prometheus configuration: the scrape configuration
// (prometheus.yml, mounted by deploy/compose.yaml) and the alert rules (rules/<name>.yml), each
// with unit tests in `promtool test rules` format beside it (rules/<name>_test.yml).
//
// Its tests prove them with Prometheus's own packages (promql, promql/parser, model/rulefmt,
// rules, promql/promqltest): every rule file parses and validates as Prometheus loads it; every
// unit-test file passes (an alert fires when its condition holds and stays silent otherwise);
// and every rule's and every Grafana panel's PromQL is evaluated on samples scraped from a
// running worker, sink and review page under load, where a query that errors, returns nothing
// where it must return something, or names a metric or label that is not served fails. The
// metrics scraped there also pass promlint.
package promdeploy
