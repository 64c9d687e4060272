package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/worker/tracing/otlp"
)

// TracingConfig is the part of the standard OpenTelemetry environment that decides whether a
// long-running command traces, and that would otherwise be misread without a word: tracing is
// on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp, and off when
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true. The SDK reads every other OTEL_*
// variable itself (headers, TLS, timeout, compression, sampler, batch processor, resource).
type TracingConfig struct {
	Endpoint       string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	TracesEndpoint string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"`
	Exporter       string `env:"OTEL_TRACES_EXPORTER"`
	Protocol       string `env:"OTEL_EXPORTER_OTLP_PROTOCOL"`
	TracesProtocol string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"`
	Disabled       string `env:"OTEL_SDK_DISABLED"`
	Sampler        string `env:"OTEL_TRACES_SAMPLER"`
	SamplerArg     string `env:"OTEL_TRACES_SAMPLER_ARG"`
}

// Enabled reports whether spans are exported.
func (c *TracingConfig) Enabled() bool {
	if strings.EqualFold(strings.TrimSpace(c.Disabled), "true") {
		return false
	}
	exporters := otelList(c.Exporter)
	for _, e := range exporters {
		if e == "none" {
			return false
		}
	}
	return len(exporters) > 0 || strings.TrimSpace(c.Endpoint) != "" || strings.TrimSpace(c.TracesEndpoint) != ""
}

// Validate reports every OTEL_* value sys1 could not honour. The SDK would log and ignore
// them; a configuration error is better found at start-up.
func (c *TracingConfig) Validate() []error {
	var errs []error
	for _, e := range otelList(c.Exporter) {
		if e != "otlp" && e != "none" {
			errs = append(errs, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported: sys1 exports traces with otlp (or none)", e))
		}
	}
	for name, v := range map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": c.Protocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": c.TracesProtocol} {
		if v = strings.TrimSpace(v); v != "" && v != "http/protobuf" {
			errs = append(errs, fmt.Errorf("%s: %q is not supported: sys1 exports OTLP over HTTP (http/protobuf); point the endpoint at the collector's OTLP/HTTP port (4318)", name, v))
		}
	}
	for name, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.Endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": c.TracesEndpoint} {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		u, err := url.Parse(v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: not a valid URL", name))
		case u.Scheme != "http" && u.Scheme != "https":
			errs = append(errs, fmt.Errorf("%s: scheme must be http or https (e.g. http://otel-collector:4318)", name))
		case u.Host == "":
			errs = append(errs, fmt.Errorf("%s: the host is missing (e.g. http://otel-collector:4318)", name))
		}
	}
	if d := strings.TrimSpace(c.Disabled); d != "" && !strings.EqualFold(d, "true") && !strings.EqualFold(d, "false") {
		errs = append(errs, fmt.Errorf("OTEL_SDK_DISABLED: %q is not true or false", d))
	}
	switch s := strings.TrimSpace(c.Sampler); s {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
	case "traceidratio", "parentbased_traceidratio":
		if a := strings.TrimSpace(c.SamplerArg); a != "" {
			if f, err := strconv.ParseFloat(a, 64); err != nil || f < 0 || f > 1 {
				errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio in [0, 1]", a))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio", s))
	}
	return errs
}

func otelList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.ToLower(strings.TrimSpace(p)); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// endpoint is where spans go, for the start-up line: scheme, host and path only.
func (c *TracingConfig) endpoint() string {
	raw := strings.TrimSpace(c.TracesEndpoint)
	if raw == "" {
		raw = strings.TrimSpace(c.Endpoint)
	}
	if raw == "" {
		return "http://localhost:4318 (the OTLP default)"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "?"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// setUpTracing returns the tracer provider of a long-running command (nil when tracing is
// off) and the function that flushes it on the way out, bounded so a collector that does not
// answer cannot hold up the exit.
func setUpTracing(ctx context.Context, cfg TracingConfig, service, instance string, log zerolog.Logger) (trace.TracerProvider, func(), error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !cfg.Enabled() {
		return nil, func() {}, nil
	}
	t, err := otlp.New(ctx, otlp.Config{ServiceName: service, Version: version, Instance: instance})
	if err != nil {
		return nil, nil, err
	}
	otlp.LogErrors(log)
	otel.SetTracerProvider(t.TracerProvider())
	// Never the headers (OTEL_EXPORTER_OTLP_HEADERS often holds an API key).
	log.Info().Str("otlp_endpoint", cfg.endpoint()).Msg("tracing: exporting spans over OTLP/HTTP")
	return t.TracerProvider(), func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("tracing: could not flush the last spans")
		}
	}, nil
}
