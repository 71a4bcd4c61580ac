package pglock_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pglock"
)

// Two instances campaign to lead the warehouse feed. The leader leads until its client
// closes, which hands the leadership over at once; the next leader resigns.
func ExampleClient_Elect() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	leading := make(chan string, 1)
	feedLeader := func(name string) pglock.LeaderCallbacks {
		return pglock.LeaderCallbacks{
			OnAcquired: func(ctx context.Context, lock *pglock.Lock) error {
				fmt.Println(name, "leads")
				leading <- name
				<-ctx.Done() // ctx ends with the leadership: the feed's work runs on it
				fmt.Printf("%s stops leading: %v\n", name, context.Cause(ctx))
				return nil
			},
			OnLost: func(lock *pglock.Lock) {
				fmt.Println(name, "stepped down")
			},
		}
	}

	clientA, err := pglock.New(pool, pglock.WithInstanceName("instance-a"))
	if err != nil {
		panic(err)
	}
	defer clientA.Close(ctx)
	if _, err := clientA.Elect("inventory:warehouse-feed", feedLeader("instance-a")); err != nil {
		panic(err)
	}
	<-leading

	clientB, err := pglock.New(pool, pglock.WithInstanceName("instance-b"))
	if err != nil {
		panic(err)
	}
	defer clientB.Close(ctx)
	electionB, err := clientB.Elect("inventory:warehouse-feed", feedLeader("instance-b"))
	if err != nil {
		panic(err)
	}

	if err := clientA.Close(ctx); err != nil { // instance-a shuts down
		panic(err)
	}
	<-leading
	fmt.Println("instance-b is the leader:", electionB.IsLeader())
	if err := electionB.Resign(ctx); err != nil {
		panic(err)
	}
	// Output:
	// instance-a leads
	// instance-a stops leading: pglock: client closed
	// instance-a stepped down
	// instance-b leads
	// instance-b is the leader: true
	// instance-b stops leading: pglock: resigned from the election
	// instance-b stepped down
}
