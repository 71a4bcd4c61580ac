// Package pglockui is a web console for pglock: the locks (held, expiring, free, who
// waits), the jobs (owner, last run, skips, a timeline of runs by instance), the
// elections and the client's Health, updated in the page about once a second, with
// force-release and prune behind a confirmation. It is an http.Handler that an
// application mounts on its own server, behind its own authentication, the way
// net/http/pprof is mounted:
//
//	console, err := pglockui.New(client, pglockui.WithAuthorize(isAdmin))
//	if err != nil {
//		return err
//	}
//	mux.Handle("/admin/pglock/", http.StripPrefix("/admin/pglock", requireLogin(console)))
//
// `pglock ui -addr :8080` serves it on its own against DATABASE_URL.
//
// # What it serves
//
//	GET  /                 the locks and semaphores' permits (also /locks): ?prefix=, ?sort=key|-key|instance|token|held|expires|waiting (- for descending), ?page=N (100 rows a page)
//	GET  /jobs             every job with history
//	GET  /jobs/{key}       a job's timeline, slots and runs (key path-escaped); ?window=1h|24h
//	GET  /elections        the leaders, when the client lists its elections
//	GET  /static/…         the embedded style sheet and script
//	POST /locks/release    force-release: form field key, and permit (1 to pglock.MaxPermits) for a semaphore's permit
//	POST /prune            Client.Prune: form field older_than, a Go duration
//
// A semaphore's permits are rows of the locks table under the semaphore's key, each
// with its own owner and token: the row carries data-permit and its key cell says
// "permit N".
//
// Every URL in its pages is relative, so that it works under any prefix and behind a
// reverse proxy; its assets are embedded (no CDN, no build step). A page fetches its
// own URL again every second and swaps in its data, so that the data a page shows is
// at most a second and one request old; the countdowns move every second in between.
// A database that does not answer shows as a banner (role="alert", status 503)
// instead of the data, until it answers again.
//
// # Slots
//
// The page of a job with a schedule (pglock.Cron, pglock.Every) shows its slots. On the
// timeline, a lane of the slots above the instances' lanes has a mark at each slot that
// ran, in the colour of its latest attempt's outcome (dashed for a retry); an
// instance's lane marks its counts of ticks that found their slot claimed and of slots
// missed, at the last one. Below, a table lists each slot with the instance, token,
// attempt and outcome of its latest attempt and the attempts before it, beside the
// slots' counts (pglock.JobStatus.Slots). The slots come from the run history: a slot
// whose run was not recorded (its holder died, or the history is off) has no mark, and
// the skipped and missed slots are counts, not times. A job's slot policy (schedule,
// catch-up, deadline, attempts) is not in the database: the page shows it for the jobs
// given to WithJobs.
//
// # Security
//
// The console shows lock keys, instance names and job errors, which are user data:
// every page is an html/template, so they are escaped, and the script never inserts
// text as HTML. The two actions are off (403) unless WithAuthorize is given, and then
// each POST must pass its function; every request goes through
// http.CrossOriginProtection, so a cross-site POST is refused (403) before it. The
// console does no authentication of its own: mount it behind the application's. Its
// pages show the store's error text, which may name the database's host and user.
package pglockui
