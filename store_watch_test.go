package pglock

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// plainTestStore has Store's methods and nothing more: a type that embeds a Store.
type plainTestStore struct{ Store }

// The watched store has what the store it watches has beyond Store, no more and no
// less: the client's parts find it by type assertion. A capability added to the stores
// must be added to watch and to caps here.
func TestWatchedStoreKeepsTheCapabilities(t *testing.T) {
	t.Parallel()
	caps := func(s Store) [2]bool {
		_, b := s.(backend)
		_, marker := s.(wantMarker)
		return [2]bool{b, marker}
	}
	for name, tc := range map[string]struct {
		store Store
		want  [2]bool
	}{
		"Postgres":      {NewPostgresStore(nil), [2]bool{true, true}},
		"SQL":           {NewSQLStore(nil), [2]bool{true, true}},
		"Memory":        {NewMemoryStore(nil), [2]bool{true, false}},
		"PlainMemory":   {plainTestStore{NewMemoryStore(nil)}, [2]bool{}},
		"PlainPostgres": {plainTestStore{NewPostgresStore(nil)}, [2]bool{}},
	} {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.want, caps(tc.store))
			w := watch(tc.store, &calls{clock: realClock{}})
			require.Equal(t, caps(tc.store), caps(w))
			_, watched := w.(interface{ watchedStore() Store })
			require.True(t, watched)
			require.Equal(t, tc.store, unwatched(w))
		})
	}
}
