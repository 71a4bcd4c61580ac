package pglock

import (
	"time"

	"github.com/pgfence/pglock/internal/store"
)

// The registry: the jobs and elections clients registered, kept in the store so that an
// operator finds a job before its first run and every election with its leader
// (JobStatuses, Elections). A client writes its registrations in the background, one
// statement at registration and one every store.RegistryRefresh, never on a caller's path
// (store.Registry).

// Registration says that an instance registered a job or an election, as the store keeps
// it (see the package doc, # Run history and registrations).
type Registration struct {
	Instance   string            // the instance's name (WithInstanceName)
	Registered time.Time         // its last registration by that instance, on the store's clock
	Seen       time.Time         // its last refresh by that instance, or its close, on the store's clock
	State      RegistrationState // whether the instance is still there
}

// RegistrationState says whether the instance of a Registration is still there, as
// the store saw it when it was read.
type RegistrationState string

// Registration states.
const (
	// RegistrationLive: not closed, and seen within the last 6 minutes (a refresh is
	// due every 5): its client is open.
	RegistrationLive RegistrationState = store.RegistrationLive
	// RegistrationClosed: the instance left: its Client was closed, or (an election)
	// it resigned.
	RegistrationClosed RegistrationState = store.RegistrationClosed
	// RegistrationGone: not closed, and not seen for over 6 minutes: its process died
	// or was killed, its Close could not reach the store, or it lost the store.
	RegistrationGone RegistrationState = store.RegistrationGone
)

func registrationOf(r store.Registration) Registration {
	return Registration{Instance: r.Instance, Registered: r.Registered, Seen: r.Seen, State: RegistrationState(r.State)}
}

// registered queues what a Job, Elect, GocronElector or GocronLocker job registered
// for the store, and for a job emits EventJobRegistered.
func (c *Client) registered(kind, key string) {
	c.registry.Add(kind, key)
	if kind == store.KindJob {
		c.emit(Event{Type: EventJobRegistered, Key: key}, nil)
	}
}
