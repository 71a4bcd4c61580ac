// Command gensql writes sql/pglock.sql: every up migration in migrations/, in order,
// as one script. The migrations are written to be idempotent (IF NOT EXISTS, CREATE OR
// REPLACE), so the script can be run again on a database that has any of them.
//
// Run it with go generate from the module root.
package main

import (
	"log"
	"os"

	"github.com/pgfence/pglock"
	"github.com/pgfence/pglock/internal/schema"
)

func main() {
	script, err := schema.Script(pglock.Migrations())
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("sql/pglock.sql", script, 0o644); err != nil {
		log.Fatal(err)
	}
}
