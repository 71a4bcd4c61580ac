// Package schema is pglock's SQL as it is now. Generate reads the catalogs of a
// migrated database and renders schema pglock as one file per area (sql/*.sql), each
// object defined once; Script joins those files into the script of pglock.SQL.
//
// # Areas
//
// schema.sql holds the schema, its sequences, tables and indexes, and the row of
// golang-migrate's table. Each function lands in the file of its area by the first
// word of its name (lock_acquire: "lock", so locks.sql), with the triggers that
// execute it; a function whose first word no area holds fails Generate, so that a new
// one is placed on purpose. The areas table is the only list to edit.
package schema

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// SchemaFile is the file of the schema, its tables, sequences and indexes.
const SchemaFile = "schema.sql"

// area is a file of functions and the first words of the names of the functions it holds.
type area struct {
	file  string
	words []string
}

// areas are the files of functions, in the order Script joins them.
var areas = []area{
	{"locks.sql", []string{"lock", "locks", "fencing"}},
	{"queue.sql", []string{"queue"}},
	{"semaphores.sql", []string{"sem"}},
	{"jobs.sql", []string{"job"}},
	{"registry.sql", []string{"registry"}},
}

// Files returns the names of the files Generate writes, in the order Script joins them:
// the tables first, then the functions, which the tables' defaults and the other
// files' functions do not need at creation.
func Files() []string {
	files := []string{SchemaFile}
	for _, a := range areas {
		files = append(files, a.file)
	}
	return files
}

// areaOf returns the file of the function named name.
func areaOf(name string) (string, error) {
	word, _, _ := strings.Cut(name, "_")
	for _, a := range areas {
		if slices.Contains(a.words, word) {
			return a.file, nil
		}
	}
	return "", fmt.Errorf("function pglock.%s: no area holds the functions named %s_*: add %q to an area of internal/schema", name, word, word)
}

// Script joins the files of dir (the output of Generate) into one script, in one
// transaction: all of it commits or none. It pins search_path, as Generate read the
// catalogs, and checks no function body at creation, as pg_dump does: a function may
// call one of a later file.
func Script(dir fs.FS) (string, error) {
	var b strings.Builder
	b.WriteString("BEGIN;\nSET LOCAL search_path = pg_catalog, pg_temp;\nSET LOCAL check_function_bodies = off;\n")
	for _, name := range Files() {
		body, err := fs.ReadFile(dir, name)
		if err != nil {
			return "", err
		}
		b.WriteString("\n")
		b.Write(body)
	}
	b.WriteString("\nCOMMIT;\n")
	return b.String(), nil
}

// Versions returns the version numbers of the up migrations, in order.
func Versions(migrations fs.FS) ([]int, error) {
	names, err := fs.Glob(migrations, "*.up.sql")
	if err != nil {
		return nil, err
	}
	versions := make([]int, len(names))
	for i, name := range names {
		if _, err := fmt.Sscanf(name, "%d_", &versions[i]); err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
	}
	return versions, nil
}
