package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// plainTestStore has Store's methods and nothing more.
type plainTestStore struct{ Store }

// batchTestStore adds BatchRenewer.
type batchTestStore struct{ Store }

func (batchTestStore) RenewMany(context.Context, []string, []string, time.Duration) ([]string, error) {
	return nil, nil
}

// The watched store has the optional capabilities of the store it watches, no more and
// no fewer: the client's parts find them by type assertion. A capability added to the
// stores must be added to watch and to caps here.
func TestWatchedStoreKeepsTheCapabilities(t *testing.T) {
	t.Parallel()
	caps := func(s Store) [6]bool {
		_, batch := s.(BatchRenewer)
		_, holder := s.(HolderReader)
		_, marker := s.(wantMarker)
		_, prune := s.(pruner)
		_, insp := s.(inspector)
		_, hist := s.(historian)
		return [6]bool{batch, holder, marker, prune, insp, hist}
	}
	for name, s := range map[string]Store{
		"Postgres": NewPostgresStore(nil),
		"Memory":   NewMemoryStore(nil),
		"Plain":    plainTestStore{NewMemoryStore(nil)},
		"Batch":    batchTestStore{NewMemoryStore(nil)},
	} {
		t.Run(name, func(t *testing.T) {
			w := watch(s, &calls{clock: realClock{}})
			require.Equal(t, caps(s), caps(w))
			_, watched := w.(interface{ watchedStore() Store })
			require.True(t, watched)
			require.Equal(t, s, unwatched(w))
		})
	}
}
