// Package pglockdev finds a PostgreSQL server for local development, and starts one
// when there is none, so that a program runs on a fresh laptop without configuration
// (pglock's examples use it):
//
//  1. the URL in an environment variable (DATABASE_URL, say), when it is set;
//  2. else the server the libpq defaults reach (PGHOST, PGPORT, PGUSER, PGPASSWORD,
//     the local socket), when one answers within 3 s;
//  3. else an embedded PostgreSQL started for the process (up to a minute; more the
//     first time, when its binaries are downloaded into the user's cache directory;
//     offline, BinariesEnv names local ones; initdb refuses to run as root).
//
// It is for local development only. A deployed program is given its database's URL
// (pgxpool.New with DATABASE_URL) and never starts a server: drop this package from a
// program you deploy. Tests use pglocktest, which finds a server the same way.
package pglockdev

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
)

// BinariesEnv names the environment variable with a directory of local PostgreSQL
// binaries (bin/, lib/, share/) for the embedded server, for machines that cannot
// download them: Debian's and Ubuntu's /usr/lib/postgresql/<version> works as it is.
const BinariesEnv = "PGLOCK_POSTGRES_BINARIES"

// Server is a PostgreSQL server that Find found or started. A Server made by hand,
// with URL set, is one Find did not start: Stop does nothing.
type Server struct {
	// URL is a postgres:// URL of a database on the server from which the caller may
	// create databases.
	URL string
	// How says where it was found, for a person: "the server in DATABASE_URL", "the
	// server the libpq defaults reach" or "an embedded PostgreSQL on port 54321".
	How string

	stop     func() error // nil when Find did not start the server
	stopOnce sync.Once
	stopErr  error
}

// Find returns the server at the URL in the environment variable envVar, else the
// one the libpq defaults reach, else an embedded PostgreSQL it starts (Stop stops
// it). ctx bounds the search, not the start. An empty envVar is
// pglock.ErrInvalidArgument; with no server at all, the error says what to set.
func Find(ctx context.Context, envVar string) (*Server, error) {
	if envVar == "" {
		return nil, invalidArg("pglockdev.Find: envVar is empty: name the variable with the URL, such as DATABASE_URL")
	}
	srv, err := devdb.Find(ctx, envVar)
	if err != nil {
		return nil, err
	}
	s := &Server{URL: srv.URL, How: srv.How}
	if srv.Embedded {
		s.stop = srv.Stop
	}
	return s, nil
}

// maxNameBytes is the longest name PostgreSQL keeps whole (NAMEDATALEN - 1).
const maxNameBytes = 63

// Database creates the database name on the server unless it exists, and returns its
// URL. ctx bounds the connection and the statement. A name that is empty, over 63
// bytes, not UTF-8 or holding a NUL is pglock.ErrInvalidArgument, and nothing is
// created.
func (s *Server) Database(ctx context.Context, name string) (string, error) {
	if name == "" || len(name) > maxNameBytes || !utf8.ValidString(name) || strings.ContainsRune(name, 0) {
		return "", invalidArg("pglockdev.Database: name %q: want 1 to %d bytes of UTF-8 without NUL", name, maxNameBytes)
	}
	return devdb.EnsureDatabase(ctx, s.URL, name)
}

// Stop stops the server if Find started it, and removes its files; otherwise it does
// nothing. Calling it again returns the first call's error.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.stop != nil {
			s.stopErr = s.stop()
		}
	})
	return s.stopErr
}

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{pglock.ErrInvalidArgument}, args...)...)
}
