package envflag

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Port is a flag value of a UDP port, 1..65535.
func Port(p *uint16) flag.Value { return portValue{p} }

// List is a flag value of a comma-separated list; empty items are dropped.
func List(l *[]string) flag.Value { return listValue{l} }

// Duration is a flag value of a positive duration.
func Duration(d *time.Duration) flag.Value { return durationValue{d: d} }

// DurationOrOff is a flag value of a duration of at least least, or 0 for
// off.
func DurationOrOff(d *time.Duration, least time.Duration) flag.Value {
	return durationValue{d: d, off: true, least: least}
}

// Bool is a flag value of a boolean (true, false, 1, 0...); the flag alone
// means true.
func Bool(b *bool) flag.Value { return boolValue{b} }

// Level is a flag value of a log level by name.
func Level(l *slog.Level) flag.Value { return levelValue{l} }

// portValue is a UDP port, 1..65535.
type portValue struct{ p *uint16 }

func (v portValue) String() string {
	if v.p == nil || *v.p == 0 { // 0: not set, no default to show
		return ""
	}
	return strconv.Itoa(int(*v.p))
}

func (v portValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return errors.New("want a UDP port number between 1 and 65535")
	}
	*v.p = uint16(n)
	return nil
}

type boolValue struct{ b *bool }

func (v boolValue) String() string   { return strconv.FormatBool(v.b != nil && *v.b) }
func (v boolValue) IsBoolFlag() bool { return true }

func (v boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want true or false")
	}
	*v.b = b
	return nil
}

// listValue is a comma-separated list; empty items are dropped.
type listValue struct{ l *[]string }

func (v listValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.Join(*v.l, ",")
}

func (v listValue) Set(s string) error {
	*v.l = nil
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*v.l = append(*v.l, item)
		}
	}
	return nil
}

// durationValue is a positive duration; with off, also 0, and then at
// least least.
type durationValue struct {
	d     *time.Duration
	off   bool
	least time.Duration
}

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	switch {
	case v.off && err == nil && (d == 0 || d >= v.least):
	case v.off:
		return fmt.Errorf("want 0 (off) or a duration of at least %v", v.least)
	case err != nil || d <= 0:
		return errors.New("want a positive duration such as 30s or 1h")
	}
	*v.d = d
	return nil
}

// levelValue is a log level by name.
type levelValue struct{ l *slog.Level }

func (v levelValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.ToLower(v.l.String())
}

func (v levelValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		*v.l = slog.LevelDebug
	case "info":
		*v.l = slog.LevelInfo
	case "warn", "warning":
		*v.l = slog.LevelWarn
	case "error":
		*v.l = slog.LevelError
	default:
		return errors.New("want debug, info, warn or error")
	}
	return nil
}
