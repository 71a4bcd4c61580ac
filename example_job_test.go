package pglock_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// Two instances of an application (in production, two processes) tick the same job:
// the first tick takes the job's lease and its instance runs every tick, whatever the
// order of the ticks; the other instance skips them (logged at debug).
func ExampleClient_Job() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	// newInstance starts an instance: a client and its job.
	tick := 0
	newInstance := func(name string) (*pglock.Client, *pglock.Job) {
		client, err := pglock.New(pool, pglock.WithInstanceName(name))
		if err != nil {
			panic(err)
		}
		job, err := client.Job("inventory:stock-reconciliation", func(ctx context.Context) error {
			fmt.Printf("tick %d: %s reconciles the stock\n", tick, name)
			return nil
		}, pglock.OnOneInstance())
		if err != nil {
			panic(err)
		}
		return client, job
	}
	clientA, jobA := newInstance("instance-a")
	defer clientA.Close(ctx) // hands the lease back
	clientB, jobB := newInstance("instance-b")
	defer clientB.Close(ctx)

	// gocron calls Run at every tick of each instance, through job.Task().
	ticks := [][]*pglock.Job{{jobA, jobB}, {jobB, jobA}, {jobB, jobA}}
	for i, order := range ticks {
		tick = i + 1
		for _, job := range order {
			if err := job.Run(ctx); err != nil {
				panic(err)
			}
		}
	}
	// Output:
	// tick 1: instance-a reconciles the stock
	// tick 2: instance-a reconciles the stock
	// tick 3: instance-a reconciles the stock
}

// A job on a gocron scheduler, every 5 minutes from now, and the shutdown order: the
// scheduler, then the client, then the pool (deferred calls run in reverse).
func ExampleJob_Task() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	client, err := pglock.New(pool)
	if err != nil {
		panic(err)
	}
	defer client.Close(ctx)

	ran := make(chan struct{}, 1)
	job, err := client.Job("inventory:stock-reconciliation", func(ctx context.Context) error {
		lock, _ := pglock.FromContext(ctx) // the run lock: its Token fences the run's writes
		fmt.Println("reconciling the stock under", lock.Key())
		ran <- struct{}{}
		return nil
	}, pglock.OnOneInstance(), pglock.WithoutOverlapping())
	if err != nil {
		panic(err)
	}

	scheduler, err := gocron.NewScheduler()
	if err != nil {
		panic(err)
	}
	defer func() { _ = scheduler.Shutdown() }()
	_, err = scheduler.NewJob(gocron.DurationJob(5*time.Minute), job.Task(),
		append(pglock.GocronOptions(job.Key()), gocron.WithStartAt(gocron.WithStartImmediately()))...)
	if err != nil {
		panic(err)
	}
	scheduler.Start()
	<-ran
	// Output:
	// reconciling the stock under inventory:stock-reconciliation
}
