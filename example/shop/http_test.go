package shop_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pglock/example/shop"
)

// response is an HTTP answer of the shop, with how long it took.
type response struct {
	status int
	raw    []byte
	body   map[string]any // when the body is a JSON object
	took   time.Duration
}

// post sends POST url with the admin token token ("" for none).
func post(t *testing.T, url, token string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, nil)
	require.NoError(t, err)
	return do(t, req, token)
}

func do(t *testing.T, req *http.Request, token string) response {
	t.Helper()
	if token != "" {
		req.Header.Set(shop.AdminTokenHeader, token)
	}
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	r := response{status: res.StatusCode, raw: b, took: time.Since(start)}
	if len(b) > 0 && b[0] == '{' {
		require.NoError(t, json.Unmarshal(b, &r.body), "body %s", b)
	}
	return r
}

// serve serves the instance's API on a test server, closed when the test ends.
func serve(t *testing.T, i *instance) string {
	t.Helper()
	srv := httptest.NewServer(i.shop.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestAdminEndpointRunsAtMostTwoExportsAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.batchSize = 1 // one order a batch: two exports at once share the three orders
	urls := []string{serve(t, w.start(t, "a")), serve(t, w.start(t, "b")), serve(t, w.start(t, "c"))}
	const path = "/admin/invoice-exports"

	for _, token := range []string{"", "wrong", "S3CRET"} {
		r := post(t, urls[1]+path, token)
		require.Equal(t, http.StatusForbidden, r.status, "token %q", token)
		require.Contains(t, r.body["error"], "forbidden")
	}
	require.Empty(t, w.accounting.Batches())

	// Exports on b and c hold the two permits, their first uploads slow.
	hold := w.accounting.Hold(2)
	answers := make(chan response, 2)
	for _, u := range urls[1:] {
		go func() { answers <- post(t, u+path, "s3cret") }()
	}
	wait(t, hold.Arrived(), "two uploads at once")

	// A request on a waits two seconds for a permit, then gives up.
	r := post(t, urls[0]+path, "s3cret")
	require.Equal(t, http.StatusConflict, r.status)
	require.Contains(t, r.body["error"], "2 invoice exports are already running")
	require.GreaterOrEqual(t, r.took, shop.ExportWait)

	hold.Release()
	r1, r2 := <-answers, <-answers
	require.Equal(t, http.StatusOK, r1.status)
	require.Equal(t, http.StatusOK, r2.status)
	require.EqualValues(t, 3, r1.body["exported"].(float64)+r2.body["exported"].(float64), "the two share the orders")
	require.ElementsMatch(t, []any{1.0, 2.0}, []any{r1.body["permit"], r2.body["permit"]}, "one permit each")
	var booked []string
	for _, b := range w.accounting.Batches() {
		booked = append(booked, b...)
	}
	require.ElementsMatch(t, firstNight, booked, "every invoice booked once")
	require.Equal(t, 2, w.accounting.MostAtOnce(), "never more uploads at once than the accounting system takes")

	// The scheduled run takes a permit too: the next tick finds nothing left.
	require.NoError(t, w.start(t, "d").shop.InvoiceExport().Run(t.Context()))
	require.Len(t, w.accounting.Batches(), 3)
	r = post(t, urls[0]+path, "s3cret")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, map[string]any{"exported": 0.0, "batches": 0.0, "permit": 1.0}, r.body)
}

func TestAdminLocksListsTheLocksTable(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := w.start(t, "a")
	base := serve(t, a)
	url := base + "/admin/locks"
	require.NoError(t, a.shop.StockReconciliation().Run(t.Context()))

	require.Equal(t, http.StatusForbidden, do(t, get(t, url), "").status)
	r := do(t, get(t, url), "s3cret")
	require.Equal(t, http.StatusOK, r.status)
	var locks []shop.LockRow
	require.NoError(t, json.Unmarshal(r.raw, &locks))
	keys := make([]string, len(locks))
	for i, l := range locks {
		keys[i] = l.Key
		_, err := time.ParseDuration(l.ExpiresIn)
		require.NoError(t, err)
		require.Positive(t, l.Token)
	}
	require.Equal(t, []string{shop.StockReconciliationKey, shop.StockReconciliationKey + ":owner", shop.WarehouseCallsKey}, keys)
	require.Equal(t, 1, locks[2].Permit, "the warehouse call's permit, released")
	require.False(t, locks[2].Held)
	require.Empty(t, locks[0].Owner, "the run lock was released")
	require.False(t, locks[0].Held)
	require.Regexp(t, `^a/`, locks[1].Owner, "the lease is a's")
	require.Equal(t, "a", locks[1].Instance)
	require.True(t, locks[1].Held)
	lease, err := time.ParseDuration(locks[1].ExpiresIn)
	require.NoError(t, err)
	require.Positive(t, lease)
	require.Greater(t, locks[0].Token, locks[1].Token, "the run lock was taken after the lease")
	require.True(t, slices.IsSorted(keys))

	r = do(t, get(t, base+"/healthz"), "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "ok", r.body["status"])
	require.Equal(t, false, r.body["leadsWarehouseFeed"])
}

func get(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	return req
}

func TestAdminConsoleNeedsTheAdminToken(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := w.start(t, "a")
	base := serve(t, a)
	require.NoError(t, a.shop.StockReconciliation().Run(t.Context()))

	res, err := http.Get(base + "/admin/console/")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	require.Contains(t, res.Header.Get("WWW-Authenticate"), "Basic")

	for path, shows := range map[string]string{
		"/admin/console/":     `<tr data-key="` + shop.StockReconciliationKey + `:owner" class="held">`,
		"/admin/console/jobs": `<table id="jobs">`,
	} {
		req := get(t, base+path)
		req.SetBasicAuth("admin", "s3cret")
		r := do(t, req, "")
		require.Equal(t, http.StatusOK, r.status, path)
		require.Contains(t, string(r.raw), shows, path)
	}
	req := get(t, base+"/admin/console/")
	req.SetBasicAuth("admin", "wrong")
	require.Equal(t, http.StatusUnauthorized, do(t, req, "").status)
	require.Equal(t, http.StatusOK, do(t, get(t, base+"/admin/console/"), "s3cret").status, "the header works too")
}
