package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"time"

	"github.com/pgfence/pglock/example/shop"
)

// The log lines the story looks for in the instances' logs.
const (
	logSkipped    = `msg="pglock: skipped job: it runs on another instance"`
	logReconciled = `msg="shop: reconciled stock"`
	jobKey        = "key=" + shop.StockReconciliationKey
	leaseKey      = shop.StockReconciliationKey + ":owner"
)

// story walks the tutorial's "Try it", recording a step for each claim.
func (d *demo) story(ctx context.Context) error {
	ttl, every := d.o.ttl, d.o.every

	d.out.say("\n== 1. Start port %d: it leads the warehouse feed and takes the reconciliation at its first tick",
		d.o.basePort)
	first, err := d.start(ctx, 0)
	if err != nil {
		return err
	}
	var h map[string]int
	holder := func(key string, want ...int) func() (bool, error) {
		return func() (bool, error) {
			var err error
			h, err = d.holders(ctx)
			return slices.Contains(want, h[key]), err
		}
	}
	_, ok, err := d.waitUntil(ctx, 10*time.Second, holder(shop.WarehouseFeedKey, first.port))
	if err != nil {
		return err
	}
	d.record("the first one leads the feed", port(first.port), port(h[shop.WarehouseFeedKey]), ok)
	_, ok, err = d.waitUntil(ctx, every+5*time.Second, func() (bool, error) {
		held, err := holder(leaseKey, first.port)()
		return held && first.count(logReconciled) > 0, err
	})
	if err != nil {
		return err
	}
	d.record("it owns the reconciliation", port(first.port)+" reconciles",
		fmt.Sprintf("lease held by %s, %d runs", port(h[leaseKey]), first.count(logReconciled)), ok)

	d.out.say("\n== 2. Start ports %d and %d: they skip every tick of the reconciliation", d.o.basePort+1, d.o.basePort+2)
	second, err := d.start(ctx, 1)
	if err != nil {
		return err
	}
	third, err := d.start(ctx, 2)
	if err != nil {
		return err
	}
	_, _, err = d.waitUntil(ctx, 2*every+5*time.Second, func() (bool, error) {
		return second.count(logSkipped, jobKey) > 0 && third.count(logSkipped, jobKey) > 0, nil
	})
	if err != nil {
		return err
	}
	if h, err = d.holders(ctx); err != nil {
		return err
	}
	others := second.count(logReconciled) + third.count(logReconciled)
	d.record("the others skip", "both skip, only "+port(first.port)+" reconciles",
		fmt.Sprintf("%s skipped %d, %s skipped %d; runs elsewhere: %d; feed: %s", port(second.port), second.count(logSkipped, jobKey),
			port(third.port), third.count(logSkipped, jobKey), others, port(h[shop.WarehouseFeedKey])),
		second.count(logSkipped, jobKey) > 0 && third.count(logSkipped, jobKey) > 0 && others == 0 && h[shop.WarehouseFeedKey] == first.port)

	d.out.say("\n== 3. The locks table: GET /admin/locks on port %d", second.port)
	if err := d.locksTable(ctx, second, first.port); err != nil {
		return err
	}

	d.out.say("\n== 4. Run the export by hand: without the admin token, then three times at once on ports %d, %d and %d:\n"+
		"   the accounting system takes %d uploads at once, so %d exports run and the third waits %v for a permit",
		first.port, second.port, third.port, shop.InvoiceExportLimit, shop.InvoiceExportLimit, shop.ExportWait)
	status, body, err := second.request(ctx, http.MethodPost, "/admin/invoice-exports", "")
	if err != nil {
		return err
	}
	d.out.say("   no token: %d %s", status, body)
	d.record("403 without the admin token", "403", fmt.Sprint(status), status == http.StatusForbidden)
	if err := d.threeExports(ctx, first, second, third); err != nil {
		return err
	}

	d.out.say("\n== 5. kill -9 port %d (pid %d), which leads the feed and runs the reconciliation", first.port, first.cmd.Process.Pid)
	killed := time.Now()
	first.signal(syscall.SIGKILL)
	d.out.say("   %s", first.wait(5*time.Second))
	if err := sleep(ctx, ttl/3-time.Since(killed)); err != nil {
		return err
	}
	if h, err = d.holders(ctx); err != nil {
		return err
	}
	d.record("nothing moves yet", fmt.Sprintf("%s holds both, ttl/3 after", port(first.port)),
		fmt.Sprintf("feed %s, job %s", port(h[shop.WarehouseFeedKey]), port(h[leaseKey])),
		h[shop.WarehouseFeedKey] == first.port && h[leaseKey] == first.port)
	survivors := []int{second.port, third.port}
	_, ok, err = d.waitUntil(ctx, ttl+ttl/3+5*time.Second, holder(shop.WarehouseFeedKey, survivors...))
	if err != nil {
		return err
	}
	// The lease was last renewed at most ttl/3 before the kill: it expires 2/3 ttl to
	// ttl after it, and a campaign comes every ttl/3.
	moved := time.Since(killed)
	d.record("then the feed moves", fmt.Sprintf("after %v to %v", (ttl*2/3).Round(time.Millisecond), (ttl+ttl/3).Round(time.Millisecond)),
		fmt.Sprintf("to %s after %v", port(h[shop.WarehouseFeedKey]), moved.Round(100*time.Millisecond)),
		ok && moved >= ttl*6/10 && moved <= ttl+ttl/3+time.Second)
	_, ok, err = d.waitUntil(ctx, ttl+every+5*time.Second, func() (bool, error) {
		held, err := holder(leaseKey, survivors...)()
		return held && d.byPort(h[leaseKey]).count(logReconciled) > 0, err
	})
	if err != nil {
		return err
	}
	d.record("and the job, at the next tick", fmt.Sprintf("by %v after the kill", ttl+every),
		fmt.Sprintf("to %s after %v", port(h[leaseKey]), time.Since(killed).Round(100*time.Millisecond)), ok)

	if !ok || !slices.Contains(survivors, h[shop.WarehouseFeedKey]) {
		return nil // the rest of the story needs a new owner
	}
	leader := d.byPort(h[shop.WarehouseFeedKey])
	last := second
	if leader == second {
		last = third
	}
	jobHere := h[leaseKey] == leader.port
	d.out.say("\n== 6. SIGTERM port %d, which leads the feed now: it hands over at once", leader.port)
	runsBefore := last.count(logReconciled)
	stopped := time.Now()
	leader.signal(syscall.SIGTERM)
	_, ok, err = d.waitUntil(ctx, ttl, holder(shop.WarehouseFeedKey, last.port))
	if err != nil {
		return err
	}
	took := time.Since(stopped)
	d.record("the feed moves at once", fmt.Sprintf("to %s, well before the ttl (%v)", port(last.port), ttl),
		fmt.Sprintf("to %s after %v", port(h[shop.WarehouseFeedKey]), took.Round(10*time.Millisecond)), ok && took < ttl/2)
	exit := leader.wait(30 * time.Second)
	d.record("it shuts down cleanly", "exit status 0", exit, exit == "exit status 0")
	if jobHere {
		_, ok, err = d.waitUntil(ctx, every+5*time.Second, func() (bool, error) {
			held, err := holder(leaseKey, last.port)()
			return held && last.count(logReconciled) > runsBefore, err
		})
		if err != nil {
			return err
		}
		d.record("the job moves at the next tick", fmt.Sprintf("to %s within %v", port(last.port), every),
			fmt.Sprintf("to %s after %v", port(h[leaseKey]), time.Since(stopped).Round(100*time.Millisecond)), ok)
	}

	d.out.say("\n== 7. Stop port %d, the last one", last.port)
	last.signal(syscall.SIGTERM)
	exit = last.wait(30 * time.Second)
	if h, err = d.holders(ctx); err != nil {
		return err
	}
	d.record("the last hands everything back", "exit status 0, no lock held",
		fmt.Sprintf("%s, %d locks held", exit, len(h)), exit == "exit status 0" && len(h) == 0)
	return nil
}

func port(p int) string {
	if p == 0 {
		return "nobody"
	}
	return fmt.Sprint(p)
}

// byPort returns the instance on port p (the last started there).
func (d *demo) byPort(p int) *instance {
	for j := len(d.instances) - 1; j >= 0; j-- {
		if d.instances[j].port == p {
			return d.instances[j]
		}
	}
	return &instance{}
}

// locksTable prints GET /admin/locks on i, and records whether owner's port holds the
// feed and the job's lease.
func (d *demo) locksTable(ctx context.Context, i *instance, owner int) error {
	status, body, err := i.request(ctx, http.MethodGet, "/admin/locks", adminToken)
	if err != nil {
		return err
	}
	var rows []shop.LockRow
	if status != http.StatusOK || json.Unmarshal([]byte(body), &rows) != nil {
		d.record("the locks table", "200 and the table", fmt.Sprintf("%d %s", status, body), false)
		return nil
	}
	cells := [][]string{{"KEY", "PERMIT", "OWNER", "TOKEN", "EXPIRES"}}
	held := map[string]int{}
	for _, r := range rows {
		permit := "-"
		if r.Permit > 0 {
			permit = fmt.Sprint(r.Permit)
		}
		cells = append(cells, []string{r.Key, permit, r.Owner, fmt.Sprint(r.Token), expires(r)})
		if r.Held {
			held[r.Key] = ownerPort(r.Owner)
		}
	}
	d.out.raw(table("   ", cells))
	d.record("the locks table", fmt.Sprintf("%d holds the feed and the lease", owner),
		fmt.Sprintf("%d rows; feed %s, lease %s", len(rows), port(held[shop.WarehouseFeedKey]), port(held[leaseKey])),
		held[shop.WarehouseFeedKey] == owner && held[leaseKey] == owner)
	return nil
}

// expires says when r's lease ends, or when it ended: "in 26.027s", "released 36m10s
// ago" (no owner), "expired 2s ago".
func expires(r shop.LockRow) string {
	if r.Held {
		return "in " + r.ExpiresIn
	}
	ended := "expired"
	if r.Owner == "" {
		ended = "released"
	}
	d, err := time.ParseDuration(r.ExpiresIn)
	if err != nil {
		return ended
	}
	return ended + " " + (-d).Round(time.Second).String() + " ago"
}

// threeExports sends POST /admin/invoice-exports to each instance at once: two take
// the exports' permits and share the three orders, the third finds both taken for
// the whole of its wait and answers 409.
func (d *demo) threeExports(ctx context.Context, instances ...*instance) error {
	type answer struct {
		port   int
		status int
		body   string
		err    error
	}
	answers := make(chan answer, len(instances))
	for _, i := range instances {
		go func() {
			status, body, err := i.request(ctx, http.MethodPost, "/admin/invoice-exports", adminToken)
			answers <- answer{i.port, status, body, err}
		}()
	}
	var ran, exported []int
	refused := 0
	for range instances {
		r := <-answers
		if r.err != nil {
			return r.err
		}
		d.out.say("   port %d: %d %s", r.port, r.status, r.body)
		var res shop.ExportResult
		switch {
		case r.status == http.StatusConflict:
			refused++
		case r.status == http.StatusOK && json.Unmarshal([]byte(r.body), &res) == nil:
			ran = append(ran, res.Permit)
			exported = append(exported, res.Exported)
		}
	}
	slices.Sort(ran)
	slices.Sort(exported)
	seen := fmt.Sprintf("%d ran (permits %v, invoices %v), %d refused", len(ran), ran, exported, refused)
	d.record("three exports at once", "2 ran (permits [1 2], invoices [1 2]), 1 refused", seen,
		seen == "2 ran (permits [1 2], invoices [1 2]), 1 refused")
	return nil
}
