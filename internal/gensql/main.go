// Command gensql writes sql/*.sql, pglock's SQL as it is now: it migrates a fresh
// database, on the server that PGLOCK_TEST_DATABASE_URL names (else the libpq
// defaults, else an embedded PostgreSQL, as the tests find one), renders its catalogs
// with internal/schema, removes the other files of sql/, and drops the database.
//
// Run it with go generate from the module root.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/devdb"
	"github.com/pgfence/pglock/internal/schema"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, "sql"); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dir string) error {
	srv, err := devdb.Find(ctx, "PGLOCK_TEST_DATABASE_URL")
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop() }()
	files, err := generate(ctx, srv.URL)
	if err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		return err
	}
	for _, name := range old {
		if _, ok := files[filepath.Base(name)]; !ok {
			if err := os.Remove(name); err != nil {
				return err
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generate migrates a new database on the server of serverURL, renders it and drops it.
func generate(ctx context.Context, serverURL string) (map[string][]byte, error) {
	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pglock_gensql_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		if _, err := admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			log.Printf("gensql: drop database %s: %v", name, err)
		}
	}()
	url, err := devdb.WithDatabase(serverURL, name)
	if err != nil {
		return nil, err
	}
	if err := pglock.Migrate(ctx, url); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return schema.Generate(ctx, conn)
}
