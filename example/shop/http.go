package shop

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
)

// AdminTokenHeader is the header the admin endpoints read the admin token from.
const AdminTokenHeader = "X-Admin-Token"

// LockRow is one row of the locks table, as GET /admin/locks lists it.
type LockRow struct {
	Key   string `json:"key"`
	Owner string `json:"owner,omitempty"` // empty once released
	Token int64  `json:"token"`
	// ExpiresIn is how long the lock lives without a renewal, on the database's clock,
	// as a Go duration ("26.027s"); negative once expired.
	ExpiresIn string `json:"expiresIn"`
}

// Handler returns the shop's HTTP API:
//
//   - GET /healthz: 200 {"status":"ok","leadsWarehouseFeed":bool}.
//   - POST /admin/invoice-exports: runs the invoice export now under its lock, waiting up
//     to ExportWait for a run in progress (scheduled or not, on any instance): 200
//     {"exported":3,"batchId":"acc_…"}, or {"exported":0} when nothing is left; 409 when
//     the lock stayed held for the whole wait.
//   - GET /admin/locks: 200, the locks table as a JSON array of LockRow, by key.
//
// The admin endpoints answer 403 without the admin token in AdminTokenHeader. Errors
// are JSON: {"error":"…"}.
func (s *Shop) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("POST /admin/invoice-exports", s.admin(s.exportNow))
	mux.HandleFunc("GET /admin/locks", s.admin(s.listLocks))
	return mux
}

func (s *Shop) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "leadsWarehouseFeed": s.LeadsWarehouseFeed()})
}

// admin guards h with the admin token, compared in constant time (of hashes, so that
// not even its length leaks).
func (s *Shop) admin(h http.HandlerFunc) http.HandlerFunc {
	want := sha256.Sum256([]byte(s.adminToken))
	return func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get(AdminTokenHeader)))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			writeError(w, http.StatusForbidden, "forbidden: this endpoint needs the admin token in "+AdminTokenHeader)
			return
		}
		h(w, r)
	}
}

// exportNow runs the export by hand. It takes the scheduled run's lock, so it never
// runs alongside a scheduled run, on any instance, nor alongside another request.
func (s *Shop) exportNow(w http.ResponseWriter, r *http.Request) {
	var res ExportResult
	err := s.locks.WithLock(r.Context(), InvoiceExportKey, func(ctx context.Context) error {
		var err error
		res, err = s.ExportInvoices(ctx)
		return err
	}, pglock.Wait(ExportWait))
	switch {
	case errors.Is(err, pglock.ErrNotAcquired):
		writeError(w, http.StatusConflict, "an invoice export is already running; try again when it has finished")
	case err != nil:
		s.logger.Error("shop: invoice export by hand failed", slog.String("key", InvoiceExportKey), slog.Any("err", err))
		writeError(w, http.StatusInternalServerError, "the invoice export failed")
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

func (s *Shop) listLocks(w http.ResponseWriter, r *http.Request) {
	locks, err := s.readLocks(r.Context())
	if err != nil {
		s.logger.Error("shop: list locks", slog.Any("err", err))
		writeError(w, http.StatusInternalServerError, "cannot read the locks table")
		return
	}
	if locks == nil {
		locks = []LockRow{} // [] rather than null
	}
	writeJSON(w, http.StatusOK, locks)
}

// readLocks reads pglock's locks table: the tutorial's psql query.
func (s *Shop) readLocks(ctx context.Context) ([]LockRow, error) {
	rows, _ := s.pool.Query(ctx, `SELECT key, coalesce(owner, ''), fencing_token,
		extract(epoch FROM expires_at - clock_timestamp())::float8 FROM pglock.locks ORDER BY key`)
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LockRow, error) {
		var l LockRow
		var secs float64
		err := row.Scan(&l.Key, &l.Owner, &l.Token, &secs)
		l.ExpiresIn = time.Duration(secs * float64(time.Second)).Round(time.Millisecond).String()
		return l, err
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
