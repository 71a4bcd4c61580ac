package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Record types: a client operation is an invoke followed by ok, fail (it certainly did
// not happen) or unknown (it may have happened: the connection broke after the
// statement was sent). Events are what the worker saw happen to it, with no invoke.
const (
	typeInvoke  = "invoke"
	typeOK      = "ok"
	typeFail    = "fail"
	typeUnknown = "unknown"
	typeEvent   = "event"
)

// Record functions (Record.F).
const (
	fAcquire = "acquire" // Acquire(key, Wait), or WithLock's acquisition
	fRelease = "release" // Lock.Release, or WithLock's release once its fn has returned
	fSection = "section" // a WithLock fn: invoke when it starts, ok when it returns
	fCancel  = "cancel"  // a WithLock fn's ctx was cancelled; Reason: closed, lost or other
	fLongTx  = "longtx"  // a fenced transaction held open past the ttl: an invoke per lock held, ok at the end
	fProbe   = "probe"   // TryAcquire on a ctx of probeTimeout
	fMutate  = "mutate"  // what a -mutate behaviour did
	fRead    = "read"    // the read of a read-modify-write (the claim, for the column fence)
	fWrite   = "write"   // the write of a read-modify-write
	fTick    = "tick"    // the OnOneInstance job's run and its fenced write
	fSkip    = "skip"    // a tick the job did not run here: Wrote the tick, Start and Local the Run call
	fSkipped = "skipped" // EventJobSkipped (emitted during a skip's Run call); Reason: why
	fLead    = "lead"    // OnAcquired called
	fUnlead  = "unlead"  // OnAcquired's ctx cancelled
	fOnLost  = "onlost"  // OnLost called
	fCtxLost = "ctxlost" // a lock's Context cancelled with a *LockLostError
	fSlow    = "slow"    // CPU burners started
	fStart   = "start"   // the worker is up
	fStop    = "stop"    // the worker shut down cleanly
	fCall    = "call"    // a pglock statement on the worker's pool (callTracer); Reason: the function
	fRenewal = "renewal" // EventRenewal: a renewal call ended; Start: sent, Local: answered
	fStall   = "stall"   // the worker's stall watch ran late: Start its due time, Local when it ran
	// Lock events from pglock.WithEventHandler keep their EventType: "acquired",
	// "released", "lost".
)

// Record is one line of a worker's history file.
type Record struct {
	Worker string    `json:"w"`
	Type   string    `json:"type"`
	F      string    `json:"f"`
	Table  string    `json:"table,omitempty"`
	Key    string    `json:"key,omitempty"`
	Op     string    `json:"op,omitempty"`
	Owner  string    `json:"owner,omitempty"`
	Token  int64     `json:"token,omitempty"`
	Read   int64     `json:"read,omitempty"`  // the value read
	Wrote  int64     `json:"wrote,omitempty"` // the value written, or the tick run
	Start  time.Time `json:"start,omitzero"`  // the invoke's time, on completions of acquire; a call's send
	Pool   time.Time `json:"pool,omitzero"`   // when a call asked the pool for its connection
	Keys   []string  `json:"keys,omitempty"`  // a batched call's keys
	Owners []string  `json:"owners,omitempty"`
	Local  time.Time `json:"t"`           // on the worker's clock
	DB     time.Time `json:"db,omitzero"` // clock_timestamp() of the statement, when it returned one
	Reason string    `json:"reason,omitempty"`
	Err    string    `json:"err,omitempty"`
}

// Fault is one fault the nemesis injected, from Start to End (equal for instant ones),
// on the controller's clock (the machine's, like the workers' and the database's).
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target,omitempty"` // a worker's id; empty for the whole server
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Detail string    `json:"detail,omitempty"`
	Err    string    `json:"err,omitempty"`
}

// Life is one worker process: a slot's incarnation.
type Life struct {
	ID     string    `json:"id"`
	Slot   int       `json:"slot"`
	PID    int       `json:"pid"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	Killed bool      `json:"killed"`           // by the nemesis (SIGKILL)
	Exit   string    `json:"exit,omitempty"`   // how it ended, when not killed by the nemesis nor cleanly
	Stderr string    `json:"stderr,omitempty"` // its log file, for a look after a failure
}

// LeaseRow is one change of a row of pglock.locks, written by a trigger: an
// acquisition, a renewal, or a release (Owner empty).
type LeaseRow struct {
	ID        int64     `json:"id"`
	Key       string    `json:"key"`
	Owner     string    `json:"owner"`
	Token     int64     `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
	At        time.Time `json:"at"`
	Xact      int64     `json:"xact,omitempty"` // the transaction; 0 in histories from before it was logged
}

// WriteRow is one write that a counter table accepted, written by a trigger in the
// write's own transaction: what the database holds, whatever the client heard back.
type WriteRow struct {
	ID       int64     `json:"id"`
	Table    string    `json:"table"`
	Key      string    `json:"key"`
	Op       string    `json:"op"`
	Old      int64     `json:"old"`
	New      int64     `json:"new"`
	OldToken int64     `json:"old_token"`
	NewToken int64     `json:"new_token"`
	At       time.Time `json:"at"`
}

// Stall is a time the controller's stall watch ran late: the controller runs the
// workers' proxies, so while it stalls every link is slow. With Server set, it is a
// time the server took to answer the controller's ping (watchServer): its processes did
// not run, whatever a worker's statement was waiting on.
type Stall struct {
	Due    time.Time `json:"due"`
	Ran    time.Time `json:"ran"`
	Server bool      `json:"server,omitempty"`
}

// Wait is a pglock statement of a worker that the controller saw waiting in the server
// (pg_stat_activity sampled every waitSample): on a lock (Lock: a row's, tuple or
// transactionid; or a relation's extension, extend), on an internal lock (LWLock, such
// as WALWrite), on I/O (IO, such as WALSync) or on a synchronous standby (IPC/SyncRep).
type Wait struct {
	At        time.Time `json:"at"` // the sample, on the database clock
	Worker    string    `json:"w"`
	PID       int32     `json:"pid"`
	Type      string    `json:"type"`
	Event     string    `json:"event"`
	Query     string    `json:"query"`
	Since     time.Time `json:"since"` // the statement's start
	Blockers  []int32   `json:"blockers,omitempty"`
	BlockedBy []string  `json:"blocked_by,omitempty"` // the blockers' statements
}

// History is everything the checker reads: the workers' records, the nemesis's faults,
// the processes, and what the database logged.
type History struct {
	Config  Config     `json:"config"`
	Records []Record   `json:"-"`
	Faults  []Fault    `json:"-"`
	Lives   []Life     `json:"-"`
	Leases  []LeaseRow `json:"-"`
	Writes  []WriteRow `json:"-"`
	Stalls  []Stall    `json:"-"`
	Waits   []Wait     `json:"-"`
	// Slots and SlotRuns are pglock.job_slots and torture.slot_runs at the end.
	Slots    []SlotRow    `json:"-"`
	SlotRuns []SlotRunRow `json:"-"`
	// Failovers, in a failover run (Config.Failover): when each primary was killed and
	// its standby promoted, and what the new primary kept.
	Failovers []Failover                  `json:"-"`
	Final     map[string]map[string]int64 `json:"final"` // table → key → value at the end
}

// historyWriter appends a worker's records to its file, one write(2) per line, so a
// SIGKILL loses at most the record being written and never tears one.
type historyWriter struct {
	worker string

	mu  sync.Mutex
	f   *os.File
	buf bytes.Buffer
	err error
}

func openHistory(path, worker string) (*historyWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &historyWriter{worker: worker, f: f}, nil
}

// add writes r, stamped with the worker and, when unset, the local time.
func (h *historyWriter) add(r Record) {
	r.Worker = h.worker
	if r.Local.IsZero() {
		r.Local = time.Now()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf.Reset()
	if err := json.NewEncoder(&h.buf).Encode(r); err != nil && h.err == nil {
		h.err = err
	}
	if _, err := h.f.Write(h.buf.Bytes()); err != nil && h.err == nil {
		h.err = err
	}
}

// close returns the first error of any write.
func (h *historyWriter) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return errors.Join(h.err, h.f.Close())
}

// Files of a run's directory.
const (
	fileConfig  = "config.json" // Config and the final counters
	fileFaults  = "faults.jsonl"
	fileLives   = "workers.jsonl"
	fileLeases  = "leases.jsonl"
	fileWrites  = "writes.jsonl"
	fileStalls  = "stalls.jsonl" // the controller's
	fileWaits   = "waits.jsonl"
	fileFovers  = "failovers.jsonl"
	fileSlots   = "slots.jsonl"
	fileSlotRun = "slot_runs.jsonl"
	historyGlob = "history-*.jsonl"
)

func historyFile(dir, worker string) string {
	return filepath.Join(dir, "history-"+worker+".jsonl")
}

// writeJSONLines writes items to path, one JSON value a line.
func writeJSONLines[T any](path string, items []T) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, it := range items {
		if err := enc.Encode(it); err != nil {
			_ = f.Close()
			return err
		}
	}
	return errors.Join(w.Flush(), f.Close())
}

// readJSONLines reads path's lines into items. A torn last line (a process killed
// mid-write) is skipped; any other bad line is an error.
func readJSONLines[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var items []T
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if len(b) > 0 {
			var it T
			if jerr := json.Unmarshal(b, &it); jerr != nil {
				if err == io.EOF && !bytes.HasSuffix(b, []byte("\n")) {
					return items, nil // torn by a kill
				}
				return nil, fmt.Errorf("%s:%d: %w", path, line, jerr)
			}
			items = append(items, it)
		}
		if err == io.EOF {
			return items, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// saveHistory writes what the controller knows (everything but the workers' own
// files) into dir, so that `torture check -dir` can check the run again.
func saveHistory(dir string, h *History) error {
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(dir, fileConfig), b, 0o644),
		writeJSONLines(filepath.Join(dir, fileFaults), h.Faults),
		writeJSONLines(filepath.Join(dir, fileLives), h.Lives),
		writeJSONLines(filepath.Join(dir, fileLeases), h.Leases),
		writeJSONLines(filepath.Join(dir, fileWrites), h.Writes),
		writeJSONLines(filepath.Join(dir, fileStalls), h.Stalls),
		writeJSONLines(filepath.Join(dir, fileWaits), h.Waits),
		writeJSONLines(filepath.Join(dir, fileFovers), h.Failovers),
		writeJSONLines(filepath.Join(dir, fileSlots), h.Slots),
		writeJSONLines(filepath.Join(dir, fileSlotRun), h.SlotRuns),
	)
}

// loadHistory reads a run's directory.
func loadHistory(dir string) (*History, error) {
	b, err := os.ReadFile(filepath.Join(dir, fileConfig))
	if err != nil {
		return nil, err
	}
	h := new(History)
	if err := json.Unmarshal(b, h); err != nil {
		return nil, fmt.Errorf("%s: %w", fileConfig, err)
	}
	if h.Faults, err = readJSONLines[Fault](filepath.Join(dir, fileFaults)); err != nil {
		return nil, err
	}
	if h.Lives, err = readJSONLines[Life](filepath.Join(dir, fileLives)); err != nil {
		return nil, err
	}
	if h.Leases, err = readJSONLines[LeaseRow](filepath.Join(dir, fileLeases)); err != nil {
		return nil, err
	}
	if h.Writes, err = readJSONLines[WriteRow](filepath.Join(dir, fileWrites)); err != nil {
		return nil, err
	}
	// Runs from before the stall watch and the wait sampler have neither file.
	if h.Stalls, err = readJSONLines[Stall](filepath.Join(dir, fileStalls)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if h.Waits, err = readJSONLines[Wait](filepath.Join(dir, fileWaits)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if h.Failovers, err = readJSONLines[Failover](filepath.Join(dir, fileFovers)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Runs from before slots have neither file.
	if h.Slots, err = readJSONLines[SlotRow](filepath.Join(dir, fileSlots)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if h.SlotRuns, err = readJSONLines[SlotRunRow](filepath.Join(dir, fileSlotRun)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, historyGlob))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		recs, err := readJSONLines[Record](f)
		if err != nil {
			return nil, err
		}
		h.Records = append(h.Records, recs...)
	}
	return h, nil
}

// workerOf returns the worker id an owner id starts with: the owner is the client's
// instance name (the worker id), a slash and a random suffix.
func workerOf(owner string) string {
	i := strings.LastIndexByte(owner, '/')
	if i < 0 {
		return ""
	}
	return owner[:i]
}
