package admin

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
)

// Level names accepted by /logging and LOG_LEVEL, upstream's set. trace is
// finer than debug; off silences a scope.
var levelNames = map[string]slog.Level{
	"trace": slog.LevelDebug - 4,
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
	"off":   slog.LevelError + 100,
}

const acceptedLevels = "error|warn|info|debug|trace|off"

func levelName(l slog.Level) string {
	for n, v := range levelNames {
		if v == l {
			return n
		}
	}
	return l.String()
}

// ParseLevel reads one of upstream's level names.
func ParseLevel(s string) (slog.Level, error) {
	l, ok := levelNames[strings.ToLower(s)]
	if !ok {
		return 0, fmt.Errorf("admin: level %q is invalid: want one of %s", s, acceptedLevels)
	}
	return l, nil
}

// Levels holds the default log level and per-scope overrides, changeable at
// run time through /logging. Loggers made by Logger consult it on every
// record, so a change applies at once without rebuilding loggers.
type Levels struct {
	base slog.Handler

	mu       sync.RWMutex
	def      slog.Level
	override map[string]slog.Level // scope → level
}

// NewLevels wraps base (which should accept every level) with run-time
// level control.
func NewLevels(base slog.Handler, def slog.Level) *Levels {
	return &Levels{base: base, def: def, override: map[string]slog.Level{}}
}

// Logger returns a logger for one scope ("proxy", "xds", ...).
func (l *Levels) Logger(scope string) *slog.Logger {
	return slog.New(&scopedHandler{levels: l, scope: scope, next: l.base.WithAttrs([]slog.Attr{slog.String("scope", scope)})})
}

func (l *Levels) enabled(scope string, lvl slog.Level) bool {
	l.mu.RLock()
	min, ok := l.override[scope]
	if !ok {
		min = l.def
	}
	l.mu.RUnlock()
	return lvl >= min
}

// MaxScopes bounds the per-scope overrides: scope names are not checked
// against the loggers that exist (a component may log under a new one), so
// without a bound each distinct name sent to /logging would be kept forever.
const MaxScopes = 64

// Set applies a /logging level spec: "debug" sets the default and clears
// overrides; "proxy:debug,xds:warn" sets scopes.
func (l *Levels) Set(spec string) error {
	type change struct {
		scope string
		level slog.Level
	}
	var changes []change
	for _, clause := range strings.Split(spec, ",") {
		scope, lvl, scoped := strings.Cut(clause, ":")
		if !scoped {
			lvl, scope = scope, ""
		}
		parsed, err := ParseLevel(lvl)
		if err != nil || (scoped && scope == "") {
			return fmt.Errorf("admin: level %q is invalid: want <level> or <scope>:<level>[,...] with level one of %s", clause, acceptedLevels)
		}
		changes = append(changes, change{scope, parsed})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	added := 0
	for _, c := range changes {
		if _, ok := l.override[c.scope]; c.scope != "" && !ok {
			added++
		}
	}
	if len(l.override)+added > MaxScopes {
		return fmt.Errorf("admin: level %q: more than %d scopes", spec, MaxScopes)
	}
	for _, c := range changes {
		if c.scope == "" {
			l.def = c.level
			clear(l.override)
			continue
		}
		l.override[c.scope] = c.level
	}
	return nil
}

// Reset drops overrides and restores def.
func (l *Levels) Reset(def slog.Level) {
	l.mu.Lock()
	l.def = def
	clear(l.override)
	l.mu.Unlock()
}

// String lists the current levels, as /logging prints them.
func (l *Levels) String() string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	parts := []string{levelName(l.def)}
	scopes := make([]string, 0, len(l.override))
	for s := range l.override {
		scopes = append(scopes, s)
	}
	sort.Strings(scopes)
	for _, s := range scopes {
		parts = append(parts, s+":"+levelName(l.override[s]))
	}
	return strings.Join(parts, ",")
}

type scopedHandler struct {
	levels *Levels
	scope  string
	next   slog.Handler
}

func (h *scopedHandler) Enabled(_ context.Context, lvl slog.Level) bool {
	return h.levels.enabled(h.scope, lvl)
}

func (h *scopedHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}

func (h *scopedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &scopedHandler{levels: h.levels, scope: h.scope, next: h.next.WithAttrs(as)}
}

func (h *scopedHandler) WithGroup(name string) slog.Handler {
	return &scopedHandler{levels: h.levels, scope: h.scope, next: h.next.WithGroup(name)}
}
