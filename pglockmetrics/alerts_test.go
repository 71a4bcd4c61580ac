package pglockmetrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/pglockmetrics"
	"github.com/pgfence/pglock/pglocktest"
)

// scrapeMetrics serves the metrics of a fresh client on the real database through the
// OTel Prometheus exporter, as an application does, with one job registered and
// nothing else done, and returns /metrics parsed as Prometheus parses it.
func scrapeMetrics(t *testing.T, job string) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	m, err := pglockmetrics.New(mp)
	require.NoError(t, err)
	c, err := pglock.New(pglocktest.Postgres(t), pglock.WithLogger(discard), pglock.WithEventHandler(m.Handle))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	stop := m.Observe(c)
	t.Cleanup(stop)
	_, err = c.Job(job, func(context.Context) error { return nil }, pglock.OnOneInstance())
	require.NoError(t, err)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)

	var families map[string]*dto.MetricFamily
	deadline := time.Now().Add(10 * time.Second)
	for { // the registration's event reaches the handler on the client's goroutine
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("Accept", "text/plain")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err = parser.TextToMetricFamilies(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		// The registration's handler adds the runs' series, then the skips', one by one: a
		// scrape between them saw the runs only (a fresh-clone CI run), or three reasons
		// of the four (another). The last one added is the fourth reason's.
		if f := families["pglock_job_skips_total"]; f != nil && len(f.GetMetric()) == 4 || time.Now().After(deadline) {
			require.NotNil(t, f, "the job's skips at 0 from its registration")
			return families
		}
		time.Sleep(10 * time.Millisecond) // polling a handler fed asynchronously
	}
}

// samples returns a family's samples as "label=value,..." → value, without the
// exporter's otel_scope_* labels.
func samples(f *dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		var parts []string
		for _, l := range m.GetLabel() {
			if !strings.HasPrefix(l.GetName(), "otel_scope_") {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
		}
		out[strings.Join(parts, ",")] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return out
}

// The counters an alert watches exist, at 0, before anything happened; no label is one
// of the labels Prometheus attaches at scrape time.
func TestMetricsAnAlertWatchesExistAtZero(t *testing.T) {
	t.Parallel()
	const job = "inventory:stock-reconciliation"
	families := scrapeMetrics(t, job)

	require.Equal(t, map[string]float64{"kind=lock,reason=expired": 0, "kind=lock,reason=refused": 0, "kind=lock,reason=release-refused": 0,
		"kind=permit,reason=expired": 0, "kind=permit,reason=refused": 0, "kind=permit,reason=release-refused": 0},
		samples(families["pglock_locks_lost_total"]))
	require.Equal(t, map[string]float64{"": 0}, samples(families["pglock_renewal_failures_total"]))
	require.Equal(t, map[string]float64{"": 0}, samples(families["pglock_events_dropped_total"]))
	require.Equal(t, map[string]float64{"kind=lock": 0, "kind=permit": 0}, samples(families["pglock_releases_total"]))
	require.Len(t, samples(families["pglock_acquisitions_total"]), 12, "6 outcomes of 2 kinds")
	require.Equal(t, map[string]float64{
		"outcome=ok,pglock_job_name=" + job: 0, "outcome=error,pglock_job_name=" + job: 0,
		"outcome=panicked,pglock_job_name=" + job: 0, "outcome=lost,pglock_job_name=" + job: 0,
	}, samples(families["pglock_job_runs_total"]))
	require.Equal(t, map[string]float64{
		"pglock_job_name=" + job + ",reason=other-instance": 0, "pglock_job_name=" + job + ",reason=run-in-progress": 0,
		"pglock_job_name=" + job + ",reason=limit-reached": 0, "pglock_job_name=" + job + ",reason=lease-in-doubt": 0,
	}, samples(families["pglock_job_skips_total"]))

	for name, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				require.NotContains(t, []string{"job", "instance"}, l.GetName(), "%s: a label Prometheus sets on scrape", name)
			}
		}
	}
}

// README's alerting rules name only metrics and labels that a real /metrics has (job
// and instance being the ones Prometheus attaches). The PromQL is checked by this
// test's reading of it, not by Prometheus's parser: that lives in the
// github.com/prometheus/prometheus module, whose dependencies (Kubernetes clients,
// cloud SDKs) would all enter this module's graph for one test.
func TestReadmeAlertsNameRealMetricsAndLabels(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)```yaml\n(groups:.*?)```").FindSubmatch(readme)
	require.NotNil(t, block, "README's alerting rules")
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(block[1], &rules))
	require.Len(t, rules.Groups, 1)

	families := scrapeMetrics(t, "inventory:stock-reconciliation")
	metricName := regexp.MustCompile(`\bpglock_[a-z_]+\b[{\[]`)
	grouping := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matcher := regexp.MustCompile(`\{([^}]*)\}`)
	labelRef := regexp.MustCompile(`\$labels\.([a-z_]+)`)
	alerts := map[string]bool{}
	for _, r := range rules.Groups[0].Rules {
		alerts[r.Alert] = true
		if r.For != "" {
			_, err := model.ParseDuration(r.For)
			require.NoError(t, err, r.Alert)
		}
		names := metricName.FindAllString(r.Expr, -1)
		require.Len(t, names, 1, "%s: one metric", r.Alert)
		names[0] = strings.TrimRight(names[0], "{[")
		f := families[names[0]]
		require.NotNil(t, f, "%s: %s is not in /metrics", r.Alert, names[0])
		labels := map[string]bool{"job": true, "instance": true} // Prometheus's target labels
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		var used []string
		for _, g := range grouping.FindAllStringSubmatch(r.Expr, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, g := range matcher.FindAllStringSubmatch(r.Expr, -1) {
			for m := range strings.SplitSeq(g[1], ",") {
				used = append(used, strings.TrimSpace(regexp.MustCompile(`[=!~].*`).ReplaceAllString(m, "")))
			}
		}
		for _, a := range r.Annotations {
			for _, l := range labelRef.FindAllStringSubmatch(a, -1) {
				used = append(used, l[1])
			}
		}
		require.NotEmpty(t, used, r.Alert)
		for _, l := range used {
			require.True(t, labels[l], "%s: label %q is not on %s", r.Alert, l, names[0])
		}
		require.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), r.Alert)
	}
	for _, want := range []string{"PglockLockLost", "PglockRenewalsFailing", "PglockJobStopped"} {
		require.True(t, alerts[want], want)
	}
}
