package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/metrics"
)

// natsExporterMetrics are the prometheus-nats-exporter series the dashboards may use (run with
// -varz -jsz=all, default prefixes; see its collector/jsz.go), with the labels they carry.
var natsExporterMetrics = map[string][]string{
	"jetstream_consumer_num_pending":       {"stream_name", "consumer_name", "account", "server_id", "server_name", "cluster"},
	"jetstream_consumer_num_ack_pending":   {"stream_name", "consumer_name", "account", "server_id", "server_name", "cluster"},
	"jetstream_consumer_num_redelivered":   {"stream_name", "consumer_name", "account", "server_id", "server_name", "cluster"},
	"jetstream_stream_total_messages":      {"stream_name", "account", "server_id", "server_name", "cluster"},
	"jetstream_stream_total_bytes":         {"stream_name", "account", "server_id", "server_name", "cluster"},
	"gnatsd_varz_connections":              {"server_id"},
	"gnatsd_varz_slow_consumers":           {"server_id"},
	"gnatsd_varz_mem":                      {"server_id"},
	"jetstream_server_total_message_bytes": {"server_id", "server_name", "cluster"},
}

// Labels every scraped series has (Prometheus adds them).
var targetLabels = []string{"job", "instance"}

type dashboard struct {
	UID, Title string
	Panels     []panel
	Templating struct {
		List []struct {
			Name       string
			Datasource datasourceRef
			Query      any
		}
	}
}

type datasourceRef struct{ Type, UID string }

type panel struct {
	ID         int
	Type       string
	Title      string
	GridPos    struct{ H, W, X, Y int }
	Datasource *datasourceRef
	Targets    []struct {
		RefID      string
		Datasource *datasourceRef
		Expr       string
		RawSQL     string `json:"rawSql"`
	}
	Panels []panel
}

func loadDashboards(t *testing.T) map[string]dashboard {
	t.Helper()
	files, err := filepath.Glob("dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	out := map[string]dashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		dec := json.NewDecoder(strings.NewReader(string(b)))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s is not valid JSON: %v", f, err)
		}
		out[f] = d
	}
	return out
}

// provisionedDatasources reads the data sources Grafana is given: uid → type.
func provisionedDatasources(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("provisioning/datasources/sys1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name, UID, Type, URL string
			JSONData             map[string]any `yaml:"jsonData"`
		}
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil || cfg.APIVersion != 1 {
		t.Fatalf("provisioning/datasources/sys1.yaml: %v (apiVersion %d)", err, cfg.APIVersion)
	}
	out := map[string]string{}
	for _, d := range cfg.Datasources {
		if d.UID == "" || d.Type == "" || d.Name == "" {
			t.Errorf("data source %+v lacks a name, uid or type", d)
		}
		out[d.UID] = d.Type
	}
	if out["clickhouse"] != "grafana-clickhouse-datasource" || out["prometheus"] != "prometheus" {
		t.Errorf("data sources %v: want prometheus and the ClickHouse plugin", out)
	}
	return out
}

// TestDashboardsAreWellFormed: valid JSON, unique uids and panel ids, panels on the 24-column
// grid without overlaps, every query on a provisioned data source of the right type, and the
// three kinds of query the issue asks for present.
func TestDashboardsAreWellFormed(t *testing.T) {
	sources := provisionedDatasources(t)
	uids := map[string]bool{}
	kinds := map[string]int{}
	for file, d := range loadDashboards(t) {
		if d.UID == "" || d.Title == "" || uids[d.UID] {
			t.Errorf("%s: uid %q title %q (uids must be unique and set)", file, d.UID, d.Title)
		}
		uids[d.UID] = true
		ids := map[int]bool{}
		type cell struct{ x, y int }
		taken := map[cell]int{}
		for _, p := range d.Panels {
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("%s: panel id %d repeated or missing", file, p.ID)
			}
			ids[p.ID] = true
			g := p.GridPos
			if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("%s: panel %q off the grid: %+v", file, p.Title, g)
			}
			for x := g.X; x < g.X+g.W; x++ {
				for y := g.Y; y < g.Y+g.H; y++ {
					if other, ok := taken[cell{x, y}]; ok {
						t.Fatalf("%s: panel %q overlaps panel %d at %d,%d", file, p.Title, other, x, y)
					}
					taken[cell{x, y}] = p.ID
				}
			}
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || len(p.Targets) == 0 {
				t.Errorf("%s: panel %d has no title or no query", file, p.ID)
			}
			for _, q := range p.Targets {
				ds := q.Datasource
				if ds == nil {
					ds = p.Datasource
				}
				if ds == nil || sources[ds.UID] != ds.Type {
					t.Errorf("%s: panel %q query %s uses data source %+v, which is not provisioned", file, p.Title, q.RefID, ds)
					continue
				}
				switch ds.Type {
				case "prometheus":
					if q.Expr == "" {
						t.Errorf("%s: panel %q: a Prometheus query without expr", file, p.Title)
					}
					kinds["promql"]++
				case "grafana-clickhouse-datasource":
					if q.RawSQL == "" {
						t.Errorf("%s: panel %q: a ClickHouse query without rawSql", file, p.Title)
					}
					kinds["sql"]++
				}
			}
		}
	}
	if kinds["promql"] < 20 || kinds["sql"] < 8 {
		t.Errorf("queries by kind %v", kinds)
	}
}

// known is every metric a dashboard may name, with its labels.
func known(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(f metrics.Family) {
		labels := append([]string{}, f.Labels...)
		if strings.HasPrefix(f.Name, "sys1_worker_") {
			labels = append(labels, "worker")
		}
		if f.Type == "histogram" {
			out[f.Name+"_bucket"] = append(append([]string{}, labels...), "le")
			out[f.Name+"_sum"] = labels
			out[f.Name+"_count"] = labels
			return
		}
		out[f.Name] = labels
	}
	for _, f := range metrics.WorkerFamilies() {
		add(f)
	}
	for _, f := range sink.MetricFamilies() {
		add(f)
	}
	fams, err := metrics.NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		out[f.GetName()] = nil
	}
	for name, labels := range natsExporterMetrics {
		out[name] = labels
	}
	return out
}

// promNames returns the metric names an expression selects, with the label names each of its
// selectors matches on, and the labels the expression groups or matches by (by, on, ignoring),
// as Prometheus's own parser reads it.
func promNames(expr string) (selectors map[string][]string, grouping []string, err error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(strings.ReplaceAll(expr, "$__rate_interval", "5m"))
	if err != nil {
		return nil, nil, err
	}
	selectors = map[string][]string{}
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				err = fmt.Errorf("a selector without a metric name: %s", n)
				return nil
			}
			if _, ok := selectors[n.Name]; !ok {
				selectors[n.Name] = nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != model.MetricNameLabel {
					selectors[n.Name] = append(selectors[n.Name], m.Name)
				}
			}
		case *parser.AggregateExpr:
			grouping = append(grouping, n.Grouping...)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				grouping = append(grouping, n.VectorMatching.MatchingLabels...)
			}
		}
		return nil
	})
	return selectors, grouping, err
}

// TestDashboardMetricsExist: every metric a dashboard's PromQL names is served by a sys1
// component (the worker's and the sink's families, the Go and process collectors) or is a
// listed NATS exporter series; every label it matches or groups on exists on those series.
func TestDashboardMetricsExist(t *testing.T) {
	all := known(t)
	used := map[string]bool{}
	for file, d := range loadDashboards(t) {
		var exprs []string
		for _, p := range d.Panels {
			for _, q := range p.Targets {
				if q.Expr != "" {
					exprs = append(exprs, q.Expr)
				}
			}
		}
		for _, v := range d.Templating.List {
			if q, ok := v.Query.(map[string]any); ok && v.Datasource.Type == "prometheus" {
				if s, _ := q["query"].(string); s != "" {
					// label_values(metric, label)
					if m := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_]+)\)$`).FindStringSubmatch(s); m != nil {
						exprs = append(exprs, "sum by ("+m[2]+") ("+m[1]+")")
					} else {
						t.Errorf("%s: variable %s: query %q is not label_values(metric, label)", file, v.Name, s)
					}
				}
			}
		}
		for _, expr := range exprs {
			sels, grouping, err := promNames(expr)
			if err != nil {
				t.Errorf("%s: %v in %s", file, err, expr)
			}
			if len(sels) == 0 {
				t.Errorf("%s: no metric in %s", file, expr)
			}
			available := slices.Clone(targetLabels)
			for name, labels := range sels {
				fam, ok := all[name]
				if !ok {
					t.Errorf("%s: %s is not a metric of sys1 or the NATS exporter list (in %s)", file, name, expr)
					continue
				}
				used[name] = true
				have := append(slices.Clone(targetLabels), fam...)
				available = append(available, fam...)
				for _, l := range labels {
					if !slices.Contains(have, l) && !(fam == nil && !strings.HasPrefix(name, "sys1_")) {
						t.Errorf("%s: %s has no label %q (in %s)", file, name, l, expr)
					}
				}
			}
			for _, l := range grouping {
				if !slices.Contains(available, l) {
					t.Errorf("%s: groups by %q, which none of its metrics has (in %s)", file, l, expr)
				}
			}
		}
	}
	// The panels: throughput, latency, error codes, queue depth and ack pending,
	// adaptive limits.
	for _, want := range []string{"sys1_worker_runs_total", "sys1_worker_run_duration_seconds_bucket", "sys1_worker_provider_latency_seconds_bucket",
		"jetstream_consumer_num_pending", "jetstream_consumer_num_ack_pending", "sys1_worker_provider_concurrency_limit", "sys1_sink_lag_records"} {
		if !used[want] {
			t.Errorf("no dashboard uses %s", want)
		}
	}
}

// The PromQL reader itself: it finds metrics and labels, and skips functions, keywords,
// strings and ranges; what does not parse is an error.
func TestPromNames(t *testing.T) {
	sels, by, err := promNames(`histogram_quantile(0.99, sum by (le, provider) (rate(x_bucket{worker=~"$worker",a!="b"}[$__rate_interval]))) / on (job) group_left y offset 5m > bool 1e3`)
	if err != nil {
		t.Fatal(err)
	}
	if len(sels) != 2 || !slices.Equal(sels["x_bucket"], []string{"worker", "a"}) || sels["y"] != nil {
		t.Errorf("selectors %v", sels)
	}
	slices.Sort(by)
	if !slices.Equal(by, []string{"job", "le", "provider"}) {
		t.Errorf("grouping %v", by)
	}
	if _, _, err := promNames(`{__name__="x"}`); err == nil {
		t.Error("a selector without a metric name passed")
	}
	if _, _, err := promNames(`sum by (le (rate(x[5m]))`); err == nil {
		t.Error("an expression that does not parse passed")
	}
}

// TestComposeWiring: compose.yaml parses; every file it mounts from deploy/ exists; every
// service a service depends on exists; Prometheus scrapes services that exist, on the port
// their SYS1_HTTP_ADDR serves; Grafana mounts this package's provisioning and dashboards where
// the provisioning file looks for them.
func TestComposeWiring(t *testing.T) {
	b, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string
			Command     []string
			Environment map[string]string
			Volumes     []string
			DependsOn   any `yaml:"depends_on"`
		}
		Volumes map[string]any
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, want := range []string{"nats", "worker", "sink", "clickhouse", "prometheus", "grafana", "nats-exporter", "jaeger"} {
		if _, ok := compose.Services[want]; !ok {
			t.Errorf("compose.yaml has no service %s", want)
		}
	}
	mounts := map[string]string{} // container path → host path, of grafana and prometheus
	for name, s := range compose.Services {
		var deps []string
		switch d := s.DependsOn.(type) {
		case []any:
			for _, x := range d {
				deps = append(deps, fmt.Sprint(x))
			}
		case map[string]any:
			for k := range d {
				deps = append(deps, k)
			}
		}
		for _, d := range deps {
			if _, ok := compose.Services[d]; !ok {
				t.Errorf("service %s depends on %s, which does not exist", name, d)
			}
		}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if strings.HasPrefix(parts[0], "./") {
				if _, err := os.Stat(filepath.Join("..", parts[0])); err != nil {
					t.Errorf("service %s mounts %s, which does not exist: %v", name, parts[0], err)
				}
				if name == "grafana" || name == "prometheus" {
					mounts[parts[1]] = parts[0]
				}
			} else if _, ok := compose.Volumes[parts[0]]; !ok && !strings.HasPrefix(parts[0], "/") {
				t.Errorf("service %s uses volume %s, which is not declared", name, parts[0])
			}
		}
	}
	if mounts["/etc/grafana/provisioning"] != "./grafana/provisioning" || mounts["/var/lib/grafana/dashboards/sys1"] != "./grafana/dashboards" ||
		mounts["/etc/prometheus/prometheus.yml"] != "./prometheus/prometheus.yml" {
		t.Errorf("mounts %v", mounts)
	}
	if got := compose.Services["grafana"].Environment["GF_PLUGINS_PREINSTALL_SYNC"]; got != "grafana-clickhouse-datasource" {
		t.Errorf("grafana installs plugin %q, want the ClickHouse data source", got)
	}
	var prov struct {
		Providers []struct {
			Options struct{ Path string }
		}
	}
	pb, _ := os.ReadFile("provisioning/dashboards/sys1.yaml")
	if err := yaml.Unmarshal(pb, &prov); err != nil || len(prov.Providers) != 1 || prov.Providers[0].Options.Path != "/var/lib/grafana/dashboards/sys1" {
		t.Errorf("dashboard provisioning: %v %+v", err, prov)
	}

	var prom struct {
		ScrapeConfigs []struct {
			JobName       string                       `yaml:"job_name"`
			StaticConfigs []struct{ Targets []string } `yaml:"static_configs"`
			DNSSDConfigs  []struct {
				Names []string
				Port  int
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	pr, err := os.ReadFile("../prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(pr, &prom); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	jobs := map[string]bool{}
	checkTarget := func(job, host, port string) {
		s, ok := compose.Services[host]
		if !ok {
			t.Errorf("job %s scrapes %s, which is no compose service", job, host)
			return
		}
		if strings.HasPrefix(job, "sys1-") && s.Environment["SYS1_HTTP_ADDR"] != ":"+port {
			t.Errorf("job %s scrapes %s:%s, but it serves SYS1_HTTP_ADDR %q", job, host, port, s.Environment["SYS1_HTTP_ADDR"])
		}
	}
	for _, sc := range prom.ScrapeConfigs {
		jobs[sc.JobName] = true
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, _ := strings.Cut(target, ":")
				checkTarget(sc.JobName, host, port)
			}
		}
		for _, d := range sc.DNSSDConfigs {
			for _, n := range d.Names {
				checkTarget(sc.JobName, n, fmt.Sprint(d.Port))
			}
		}
	}
	for _, want := range []string{"sys1-worker", "sys1-sink", "nats"} {
		if !jobs[want] {
			t.Errorf("prometheus.yml has no job %s (the dashboards select it)", want)
		}
	}
	if cmd := strings.Join(compose.Services["nats-exporter"].Command, " "); !strings.Contains(cmd, "-jsz=all") || !strings.Contains(cmd, "http://nats:8222") {
		t.Errorf("nats-exporter command %q: want -jsz=all against nats:8222 (compose.conf's http_port)", cmd)
	}
}
