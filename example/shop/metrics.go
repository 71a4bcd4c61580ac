package shop

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockmetrics"
)

// Metrics is one instance's telemetry: pglock's metrics (package pglockmetrics), on an
// OpenTelemetry MeterProvider whose Prometheus exporter writes to a registry of its
// own, which GET /metrics serves. A registry of its own rather than Prometheus's global
// one: two shops in one process (a test) must not collide, and /metrics shows nothing
// the shop did not choose.
type Metrics struct {
	pglock   *pglockmetrics.Metrics
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// ServiceName is the shop's OpenTelemetry service.name.
const ServiceName = "shop"

// NewMetrics returns an instance's telemetry. Give EventHandler to the instance's
// pglock client, Metrics to its Config, and Shutdown it after the client's Close.
func NewMetrics() (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("shop: metrics exporter: %w", err)
	}
	// The service's name, which target_info carries: without it, it would be
	// unknown_service:<the binary's name>.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("shop: metrics resource: %w", err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	m, err := pglockmetrics.New(provider)
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	return &Metrics{pglock: m, provider: provider,
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})}, nil
}

// EventHandler is the pglock client option that records the client's events.
func (m *Metrics) EventHandler() pglock.ClientOption {
	return pglock.WithEventHandler(m.pglock.Handle)
}

// Shutdown stops the meter provider; ctx bounds it.
func (m *Metrics) Shutdown(ctx context.Context) error {
	return m.provider.Shutdown(ctx)
}
