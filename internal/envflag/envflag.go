// Package envflag is a flag set whose flags may take their value from an
// environment variable: a flag on the command line wins over the variable,
// the variable over the default. Docker passes a managed plugin's settings
// as environment variables. An empty variable counts as unset.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// UsageError is a bad command line or environment.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef is a UsageError.
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// Set is a flag.FlagSet with environment variables; its Parse is
// ParseEnv's.
type Set struct {
	*flag.FlagSet
	envs map[string]string // flag name -> variable
}

// New returns a set printing "usage: " and usage, then the flags, for -h.
func New(name, usage string, out io.Writer) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: %s\n\nflags (a flag wins over its environment variable):\n", usage)
		fs.PrintDefaults()
	}
	return &Set{FlagSet: fs, envs: map[string]string{}}
}

// StringEnv is a string flag, or variable env.
func (f *Set) StringEnv(p *string, name, env, def, usage string) {
	f.envs[name] = env
	f.StringVar(p, name, def, usage+" (env "+env+")")
}

// VarEnv is a flag of any value, or variable env.
func (f *Set) VarEnv(v flag.Value, name, env, usage string) {
	f.envs[name] = env
	f.Var(v, name, usage+" (env "+env+")")
}

// ParseEnv applies the environment, then args. A bad variable is a usage error
// naming it. It returns flag.ErrHelp for -h.
func (f *Set) ParseEnv(args []string, getenv func(string) string) error {
	var errs []error
	f.VisitAll(func(fl *flag.Flag) {
		env, ok := f.envs[fl.Name]
		if !ok {
			return
		}
		if v := getenv(env); v != "" {
			if err := fl.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q (--%s): %v", env, v, fl.Name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return UsageError{err}
	}
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return UsageError{err} // the flag package has printed the usage
	}
	if f.NArg() > 0 {
		return Usagef("%s: unexpected argument %q", f.Name(), f.Arg(0))
	}
	return nil
}
