// Package grafana holds sys1's Grafana dashboards (dashboards/*.json) and their provisioning
// (provisioning/), which deploy/compose.yaml mounts beside Prometheus
// (deploy/prometheus/prometheus.yml). Its tests check the dashboards' JSON, that every metric
// their PromQL names exists (read by Prometheus's parser; in the worker's and the sink's
// registries, the Go and process collectors, or the NATS exporter's list below), and
// compose.yaml's wiring. deploy/prometheus evaluates every panel's PromQL with Prometheus's
// engine on a fleet scraped under load; the dashboards' SQL is run against ClickHouse by
// sink/dashboards_test.go.
package grafana
