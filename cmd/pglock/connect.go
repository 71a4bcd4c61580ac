package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// conn is a connection to the database, checked, with a pglock client on it.
type conn struct {
	e      *env
	url    string // as given: -url, DATABASE_URL or "" (libpq defaults)
	from   string // where url came from, for a person
	pool   *pgxpool.Pool
	client *pglock.Client
	where  string // host:port, for messages
	db     string
	user   string
}

// connString is -url, else DATABASE_URL, else "" (the libpq defaults), and where it
// came from.
func (e *env) connString() (url, from string) {
	if e.url != "" {
		return e.url, "-url"
	}
	if u := e.getenv("DATABASE_URL"); u != "" {
		return u, "DATABASE_URL"
	}
	return "", "the libpq defaults: no -url, no DATABASE_URL"
}

// connect opens a small pool on the database and pings it within -timeout, so that a
// server that does not answer is reported as such before any command runs. It
// creates nothing in the database. Close the conn.
func (e *env) connect(ctx context.Context) (*conn, error) {
	url, from := e.connString()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usageError("the connection string (-url or DATABASE_URL) is not valid: %v", err)
	}
	cfg.MaxConns = 2
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pglock-cli"
	}
	db := cfg.ConnConfig.Database
	if db == "" {
		db = cfg.ConnConfig.User // as libpq and the server default it
	}
	c := &conn{e: e, url: url, from: from, where: where(cfg.ConnConfig.Host, cfg.ConnConfig.Port), db: db,
		user: cfg.ConnConfig.User}
	c.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglock: connect to %s: %w", c.where, err)
	}
	pctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	if err := c.pool.Ping(pctx); err != nil {
		c.pool.Close()
		return nil, c.connectError(ctx, err)
	}
	c.client, err = pglock.New(c.pool, pglock.WithoutListener(), pglock.WithInstanceName("pglock-cli"), pglock.RunHistory(0),
		pglock.WithLogger(slog.New(slog.DiscardHandler))) // what it does, it prints
	if err != nil {
		c.pool.Close()
		return nil, err
	}
	return c, nil
}

// close closes the client, then the pool.
func (c *conn) close() {
	if c.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.e.timeout)
		_ = c.client.Close(ctx) // the CLI holds no lock: nothing to hand back
		cancel()
	}
	c.pool.Close()
}

// reached says which database c is on, never with the password: the first line of
// every command's output for people, so that a default is never taken silently.
func (c *conn) reached() string {
	return wrap("database "+c.names(), c.e.width)
}

// names names c's database, server and user, and where they came from.
func (c *conn) names() string {
	return fmt.Sprintf("%q at %s, user %q (from %s)", c.db, c.where, c.user, c.from)
}

// where formats a server's address for messages: host:port, or a Unix socket's path.
func where(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		return fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// connectError says why the connection failed, in the operator's words.
func (c *conn) connectError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("pglock: interrupted while connecting to %s", c.where)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3D000": // invalid_catalog_name
			return fmt.Errorf("pglock: database %q does not exist at %s: name another with -url or DATABASE_URL", c.db, c.where)
		case "28000", "28P01": // invalid_authorization_specification, invalid_password
			return fmt.Errorf("pglock: PostgreSQL at %s refused the connection: %s", c.where, pgErr.Message)
		}
		return fmt.Errorf("pglock: PostgreSQL at %s: %w", c.where, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pglock: PostgreSQL unreachable at %s: no answer within %v (-timeout)", c.where, c.e.timeout)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return fmt.Errorf("pglock: PostgreSQL unreachable at %s: %v", c.where, dnsErr)
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return fmt.Errorf("pglock: PostgreSQL unreachable at %s: %v", c.where, opErr.Err)
	}
	return fmt.Errorf("pglock: PostgreSQL unreachable at %s: %w", c.where, err)
}

// statementContext bounds one statement of locks, jobs or release with -timeout.
func (c *conn) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.e.timeout)
}

// explain turns the error of a pglock call (what describes it) into one an operator
// can act on: a missing or old schema says to run `pglock migrate`, a timeout names
// -timeout. Other errors are pglock's own, already prefixed.
func (c *conn) explain(ctx context.Context, what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "3F000": // invalid_schema_name
			return c.schemaMissing()
		case "42883", "42P01": // undefined_function, undefined_table
			if !c.schemaExists(ctx) {
				return c.schemaMissing()
			}
			return fmt.Errorf("pglock: %s: database %q at %s: schema pglock is older than this pglock (%s): run `pglock migrate`",
				what, c.db, c.where, pgErr.Message)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("pglock: %s: interrupted", what)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pglock: %s: no answer from PostgreSQL at %s within %v (-timeout): %w", what, c.where, c.e.timeout, err)
	}
	if errors.Is(err, pglock.ErrInvalidKey) || errors.Is(err, pglock.ErrInvalidArgument) {
		return &cliError{exitUsage, err}
	}
	return err
}

// schemaMissing is the error of a command that finds no schema pglock: exit 1.
func (c *conn) schemaMissing() error {
	return fmt.Errorf("pglock: database %q at %s: schema pglock not found: run `pglock migrate`", c.db, c.where)
}

// schemaBehind is the error of a command that finds schema pglock pending migrations
// of this pglock: exit 1.
func (c *conn) schemaBehind(pending int) error {
	return fmt.Errorf("pglock: database %q at %s: schema pglock is %s behind this pglock: run `pglock migrate`",
		c.db, c.where, plural(pending, "migration"))
}

// schemaExists reports whether the schema pglock exists; false when that cannot be read.
func (c *conn) schemaExists(ctx context.Context) bool {
	ctx, cancel := c.statementContext(ctx)
	defer cancel()
	var exists bool
	err := c.pool.QueryRow(ctx, `SELECT to_regnamespace('pglock') IS NOT NULL`).Scan(&exists)
	return err == nil && exists
}
