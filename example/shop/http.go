package shop

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/pgfence/pglock"
)

// AdminTokenHeader is the header the admin endpoints read the admin token from.
const AdminTokenHeader = "X-Admin-Token"

// LockRow is one lock, as GET /admin/locks lists it (from pglock.Client.Locks).
type LockRow struct {
	Key      string `json:"key"`                // for a permit, its semaphore's
	Permit   int    `json:"permit,omitempty"`   // a semaphore's permit's number; 0 for a lock
	Owner    string `json:"owner,omitempty"`    // empty once released
	Instance string `json:"instance,omitempty"` // the instance part of Owner
	Token    int64  `json:"token"`
	Held     bool   `json:"held"` // a live holder has it now
	// ExpiresIn is how long the lock lives without a renewal, on the database's clock,
	// as a Go duration ("26.027s"); zero or negative once released or expired.
	ExpiresIn string `json:"expiresIn"`
	Waiting   bool   `json:"waiting,omitempty"` // a waiter wants it
}

// Handler returns the shop's HTTP API:
//
//   - GET /healthz: readiness, from the pglock client's Health: 200
//     {"status":"ok","leadsWarehouseFeed":bool,"locksHeld":1,"lastRenewal":"2026-…Z"} while
//     the database answers and its renewals are confirmed; 503
//     {"status":"unready","error":"…","failedCall":"renew","failedAt":"…",…} while a call
//     to the database fails or waits, or a renewal is overdue (before any lock is lost:
//     send no work here), and after Close. The body names no connection detail (user,
//     host, database): the error itself goes to the log. A readiness probe, not a
//     liveness one: restarting an instance does not bring its database back.
//   - GET /metrics: pglock's metrics in Prometheus's text format, when Config.Metrics
//     is set.
//   - POST /admin/invoice-exports: runs the invoice export now under a permit of
//     InvoiceExportsKey, waiting up to ExportWait while InvoiceExportLimit exports run
//     (scheduled or not, on any instances): 200
//     {"exported":3,"batchId":"acc_…","batches":1,"permit":1}, or {"exported":0,…} when
//     nothing is left (or an export in progress took it); 409 when every permit stayed
//     taken for the whole wait.
//   - GET /admin/locks: 200, the locks table as a JSON array of LockRow, by key.
//   - /admin/console/: pglock's web console (package pglockui): the locks, the jobs
//     and their timelines, force-release and prune. A browser gives the admin token as
//     the password of HTTP Basic authentication (any user name): the console answers
//     401 with a WWW-Authenticate challenge, so that the browser asks for it.
//
// The admin endpoints answer 403 without the admin token in AdminTokenHeader (or, for
// the console, as the Basic password). Errors are JSON: {"error":"…"}.
func (s *Shop) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	if s.metrics != nil {
		mux.Handle("GET /metrics", s.metrics.handler)
	}
	mux.HandleFunc("POST /admin/invoice-exports", s.admin(s.exportNow))
	mux.HandleFunc("GET /admin/locks", s.admin(s.listLocks))
	mux.Handle("/admin/console/", s.admin(http.StripPrefix("/admin/console", s.console).ServeHTTP))
	return mux
}

func (s *Shop) healthz(w http.ResponseWriter, _ *http.Request) {
	h := s.locks.Health()
	body := map[string]any{"status": "ok", "leadsWarehouseFeed": s.LeadsWarehouseFeed(), "locksHeld": h.LocksHeld}
	if !h.LastRenewal.IsZero() {
		body["lastRenewal"] = h.LastRenewal.UTC()
	}
	status := http.StatusOK
	if !h.Ready {
		// h.Err wraps the driver's error, which names the database's user, host and
		// database: it goes to the log, and the body says only what kind of trouble.
		s.logger.Warn("shop: unready", slog.Any("err", h.Err))
		status, body["status"] = http.StatusServiceUnavailable, "unready"
		switch {
		case errors.Is(h.Err, pglock.ErrClosed):
			body["error"] = "shutting down: the lock client is closed"
		case h.FailedCall != "":
			body["error"] = "the database does not answer: see the instance's log"
			body["failedCall"], body["failedAt"] = h.FailedCall, h.FailedAt.UTC()
		default:
			body["error"] = "lock renewals are overdue: see the instance's log"
		}
	}
	writeJSON(w, status, body)
}

// admin guards h with the admin token, compared in constant time (of hashes, so that
// not even its length leaks).
func (s *Shop) admin(h http.HandlerFunc) http.HandlerFunc {
	want := sha256.Sum256([]byte(s.adminToken))
	return func(w http.ResponseWriter, r *http.Request) {
		token := r.Header.Get(AdminTokenHeader)
		_, password, basic := r.BasicAuth()
		if token == "" && basic {
			token = password
		}
		got := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			if strings.HasPrefix(r.URL.Path, "/admin/console/") {
				w.Header().Set("WWW-Authenticate", `Basic realm="shop admin: the admin token as password", charset="UTF-8"`)
				writeError(w, http.StatusUnauthorized, "unauthorized: the console needs the admin token as the Basic password")
				return
			}
			writeError(w, http.StatusForbidden, "forbidden: this endpoint needs the admin token in "+AdminTokenHeader)
			return
		}
		h(w, r)
	}
}

// exportNow runs the export by hand, under a permit of the exports as a scheduled run,
// so that the accounting system never gets more than InvoiceExportLimit uploads at
// once, from any instances.
func (s *Shop) exportNow(w http.ResponseWriter, r *http.Request) {
	res, err := s.exportLimited(r.Context(), pglock.Wait(ExportWait))
	switch {
	case errors.Is(err, pglock.ErrNotAcquired):
		writeError(w, http.StatusConflict, fmt.Sprintf("%d invoice exports are already running, as many as the accounting system takes; try again when one has finished", InvoiceExportLimit))
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
	writeJSON(w, http.StatusOK, locks)
}

// readLocks lists every lock pglock's table holds, by key, with Client.Locks: the
// application needs no privilege on the table itself.
func (s *Shop) readLocks(ctx context.Context) ([]LockRow, error) {
	locks, err := s.locks.Locks(ctx, "")
	if err != nil {
		return nil, err
	}
	rows := make([]LockRow, len(locks)) // [] rather than null when empty
	for i, l := range locks {
		rows[i] = LockRow{Key: l.Key, Permit: l.Permit, Owner: l.Owner, Instance: l.Instance, Token: l.Token, Held: l.Held,
			ExpiresIn: l.ExpiresIn.Round(time.Millisecond).String(), Waiting: l.Waiting}
	}
	return rows, nil
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
