// Package otlp sets up the OpenTelemetry SDK for a sys1 process: a tracer provider whose
// spans leave through a batch span processor and an OTLP/HTTP exporter. Everything the
// OpenTelemetry specification lets the environment set is read by the SDK itself
// (OTEL_EXPORTER_OTLP_*, OTEL_TRACES_SAMPLER*, OTEL_BSP_*, OTEL_SPAN_*_LIMIT,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES); whether tracing is on at all is the command
// layer's decision.
//
// Why OTLP over HTTP and not gRPC: it is the protocol the specification makes the default
// (http/protobuf, port 4318), every collector and tracing backend accepts it, it passes plain
// HTTP proxies and load balancers, and it needs no long-lived gRPC connection with its own
// reconnect and keep-alive behaviour to reason about.
//
// Exporting never holds up a run: spans are queued (OTEL_BSP_MAX_QUEUE_SIZE, 2048) and
// exported in the background; when the collector is slow or unreachable the queue fills and
// further spans are dropped, never waited for. Shutdown flushes within the caller's deadline.
package otlp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Config describes the process to the tracing backend.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) sets
	// one ("sys1-worker", "sys1-sink").
	ServiceName string
	// Version is service.version; Instance is service.instance.id (the replica id).
	Version, Instance string
	// Exporter replaces the OTLP/HTTP exporter (tests use tracetest's in-memory one). The
	// batch span processor is used either way, unless Sync is set.
	Exporter sdktrace.SpanExporter
	// Sync exports each span as it ends (tests only: it makes runs wait on the exporter).
	Sync bool
	// Options are further tracer provider options (tests: a sampler).
	Options []sdktrace.TracerProviderOption
}

// Tracing is a process's tracer provider.
type Tracing struct {
	tp *sdktrace.TracerProvider
}

// New builds the tracer provider. It does no network I/O: the exporter connects when it
// first exports.
func New(ctx context.Context, cfg Config) (*Tracing, error) {
	exp := cfg.Exporter
	if exp == nil {
		var err error
		// Endpoint, headers, TLS, compression and timeout come from OTEL_EXPORTER_OTLP_*.
		if exp, err = otlptracehttp.New(ctx); err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
	}
	attrs := []resource.Option{resource.WithTelemetrySDK(), resource.WithAttributes(semconv.ServiceName(cfg.ServiceName))}
	if cfg.Version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(cfg.Version)))
	}
	if cfg.Instance != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(cfg.Instance)))
	}
	// Last, so the environment overrides the defaults above.
	attrs = append(attrs, resource.WithFromEnv())
	res, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if cfg.Sync {
		opts = append(opts, sdktrace.WithSyncer(exp))
	} else {
		// Queue size, batch size, delay and export timeout: OTEL_BSP_*. A full queue drops.
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	opts = append(opts, cfg.Options...)
	return &Tracing{tp: sdktrace.NewTracerProvider(opts...)}, nil
}

// TracerProvider is what components start spans with.
func (t *Tracing) TracerProvider() trace.TracerProvider { return t.tp }

// Shutdown exports what is queued and stops, within ctx's deadline.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing shutdown: %w", err)
	}
	return nil
}

// LogErrors sends the OpenTelemetry SDK's own errors (an export that failed, a span dropped)
// to log as warnings, at most one a minute, saying how many were not logged: an unreachable
// collector fails every batch, and must not flood the log.
func LogErrors(log zerolog.Logger) {
	otel.SetErrorHandler(newLimitedHandler(log, time.Minute))
}

type limitedHandler struct {
	log    zerolog.Logger
	every  time.Duration
	mu     sync.Mutex
	last   time.Time
	missed int
}

func newLimitedHandler(log zerolog.Logger, every time.Duration) *limitedHandler {
	return &limitedHandler{log: log, every: every}
}

func (h *limitedHandler) Handle(err error) {
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < h.every {
		h.missed++
		h.mu.Unlock()
		return
	}
	missed := h.missed
	h.last, h.missed = now, 0
	h.mu.Unlock()
	h.log.Warn().Err(err).Int("not_logged_since_last", missed).Msg("tracing: the OpenTelemetry SDK reported an error (spans may be lost; runs are not affected)")
}
