package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/sink"
)

// validator is implemented by component config structs that check more than types.
// Validate returns one error per bad variable, each naming the variable.
type validator interface {
	Validate() []error
}

// check is a loadConfig target that parses nothing: it runs after the targets before it have
// been parsed, and its errors join theirs, so a command's own requirements (a variable it cannot
// run without, a bad flag) are reported in the same message as every other bad variable.
type check func() []error

// requireDSN is the check of commands that cannot run without ClickHouse.
func requireDSN(cfg *sink.Config) check {
	return func() []error {
		if cfg.DSN == "" {
			return []error{errors.New("SYS1_CLICKHOUSE_DSN is not set (e.g. clickhouse://localhost:9000 or http://localhost:8123)")}
		}
		return nil
	}
}

// loadConfig parses every component's env struct and validates them, returning one error that
// names every bad variable, so an operator fixes a deployment in one pass.
func loadConfig(targets ...any) error {
	var problems []string
	reported := map[string]bool{} // variables with a parse error: their Validate findings are noise
	for _, t := range targets {
		if c, ok := t.(check); ok {
			// Not an env struct: a check across commands' settings (a required variable, a
			// flag), reported with the rest.
			for _, e := range c() {
				problems = append(problems, e.Error())
			}
			continue
		}
		keys := envKeys(reflect.TypeOf(t))
		if err := env.Parse(t); err != nil {
			var agg env.AggregateError
			if !errors.As(err, &agg) {
				problems = append(problems, err.Error())
				continue
			}
			for _, e := range agg.Errors {
				problems = append(problems, describeEnvError(e, keys))
				var pe env.ParseError
				if errors.As(e, &pe) && keys[pe.Name] != "" {
					reported[keys[pe.Name]] = true
				}
			}
		}
		if v, ok := t.(validator); ok {
			for _, e := range v.Validate() {
				name, _, _ := strings.Cut(e.Error(), ":")
				if !reported[name] {
					problems = append(problems, e.Error())
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid configuration:\n  - %s", strings.Join(problems, "\n  - "))
	}
	return nil
}

// describeEnvError rewrites the env library's "parse error on field X" into the variable's
// name and value, which is what an operator can act on.
func describeEnvError(err error, keys map[string]string) string {
	var pe env.ParseError
	if errors.As(err, &pe) {
		if key := keys[pe.Name]; key != "" {
			return fmt.Sprintf("%s: %q is not a valid %s", key, os.Getenv(key), typeWord(pe.Type))
		}
	}
	return err.Error()
}

func typeWord(t reflect.Type) string {
	if t == reflect.TypeOf(time.Duration(0)) {
		return "duration (e.g. 30s, 5m)"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "whole number"
	case reflect.Bool:
		return "boolean (true or false)"
	case reflect.Float32, reflect.Float64:
		return "number"
	}
	return t.String()
}

// envKeys maps struct field names to their env variable, through nested structs.
func envKeys(t reflect.Type) map[string]string {
	keys := map[string]string{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			if key, _, _ := strings.Cut(f.Tag.Get("env"), ","); key != "" {
				keys[f.Name] = key
			} else if f.Type.Kind() == reflect.Struct {
				walk(f.Type)
			}
		}
	}
	walk(t)
	return keys
}

// LogConfig is the logging configuration shared by every long-running subcommand.
type LogConfig struct {
	Level string `env:"SYS1_LOG_LEVEL" envDefault:"info"`
}

// Validate checks the level name.
func (c *LogConfig) Validate() []error {
	if _, err := zerolog.ParseLevel(strings.ToLower(c.Level)); err != nil || c.Level == "" {
		return []error{fmt.Errorf("SYS1_LOG_LEVEL: %q is not one of trace, debug, info, warn, error", c.Level)}
	}
	return nil
}

// zerolog's time format is process-wide: it is set before anything can log, never while a
// component started earlier in the same process (the tests run a worker, a sink and a review
// page side by side) reads it for a log line.
func init() { zerolog.TimeFieldFormat = time.RFC3339Nano }

// newLogger returns the JSON logger on w (stderr in production) at the configured level.
func newLogger(w io.Writer, cfg LogConfig, component string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(strings.ToLower(cfg.Level))
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", component).Logger()
}
